"""Units and default constants, in one place. Names carry their units."""

GIB_BYTES = 2**30

# Bytes per stored weight element, by precision name.
BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
OUTPUT_BYTES_PER_ELEMENT = 4  # pooled outputs and their gradients are fp32

# Column-wise sharding: every shard's dim is a multiple of this.
DIM_ALIGNMENT = 4
TASK_DIMS = (4, 8, 16, 32, 64, 128)

# Analytic (roofline) cost model defaults, for one CPU core running FBGEMM's TBE with one thread
# and gloo all-to-all over loopback, fitted to the shipped CPU dataset by python -m neuroshard_jax.train
# family=analytic (squared log error, training split); AnalyticConfig's defaults.
ANALYTIC_MEM_BW_GBPS = 10.7  # effective bandwidth of row gathers and updates, GB/s (1e9 bytes)
ANALYTIC_BWD_FWD_RATIO = 2.0  # backward (gradient + SGD row update) over forward bytes, as TorchRec assumes
ANALYTIC_KERNEL_OVERHEAD_MS = 0.001  # fixed cost of one fused TBE call (fwd + bwd), ms
ANALYTIC_TABLE_OVERHEAD_MS = 1.07  # per table in the fused kernel, ms
ANALYTIC_COMM_BW_GBPS = 2.73  # all-to-all bandwidth per device, GB/s
ANALYTIC_COMM_LATENCY_MS = 3.48  # fixed cost of one all-to-all, ms

# How to install TorchRec on top of this project (its metadata asks for the CUDA fbgemm-gpu, hence --no-deps).
TORCHREC_INSTALL = "pip install --no-deps torchrec==1.8.0 && pip install -e '.[torchrec]' (see docs/installing.md)"

# What ships inside the package (paths relative to the neuroshard_jax package directory).
SHIPPED_MODELS = "data/models"  # shipped cost-model checkpoints, one folder per name (cost_model.name=NAME)
SHIPPED_MODEL_NAME = "xeon-union"  # the default neural cost model: the physics ensemble (format 4), Intel Xeon,
# trained on the pool, the spec sampler and the loop's plan labels (xeon-ensemble: the first two only)
SHIPPED_CHECKPOINT = f"{SHIPPED_MODELS}/{SHIPPED_MODEL_NAME}"
# The first shipped model (format 3, per-table MLP at batch 4096): the RL trainer's cost model, and the ablation's.
SHIPPED_MLP_CHECKPOINT = f"{SHIPPED_MODELS}/cpu-b4096"
SHIPPED_POLICY = "data/policies/cpu-b4096"  # the rl searcher's policy (python -m neuroshard_jax.train_policy)

# A CPU label whose worker process got less of its core than this during the timed iterations was taken while
# something else ran: sustained contention slows every run alike (a low spread) and inflated labels 2-4x here.
MIN_CPU_SHARE = 0.9
# glibc's largest mmap threshold on 64-bit (4 MiB x sizeof(long)): a block above it goes back to the OS when freed, so
# a kernel's output this large was page-faulted afresh on some calls (kernels.processes.MALLOC_ENV)
GLIBC_MMAP_MAX_BYTES = 32 * 2**20

# The synthetic pool generator's version: part of every synthetic pool's id and of its random streams.
GENERATOR_VERSION = 1
ZIPF_VERSION = 1  # the zipf pool's law (workloads.zipf_pool): in its pool id
MIN_ROWS = 100  # the DLRM rule for a table read from its lookups: rows = max(100, largest index + 1)

MAX_CAP_GB = float(2**20)  # a device of at most 1 PiB: past it, bytes outgrow int64 arithmetic
# The most devices a task may have. The search's arrays grow with the devices (every placement weighs each device):
# about 1.1 MB a device for the smallest task, so 4,096 devices of 3 tables planned in 72 s at a 4.6 GB peak on a
# 2-core Xeon, and 100,000 devices grew past 12 GB before the kernel's killer came (issue 64); the largest clusters
# TorchRec shards over are a few thousand GPUs
MAX_DEVICES = 4096
# What sizes a table's and a batch's arrays, bounded so that every byte and lookup count stays exact in int64 and the
# samplers' laws stay finite (a probe's rows of 1e30, pooling of 1e300 and batch of 2**62 ended in OverflowError):
# far past any recommendation model's (tables of 1e10 rows, dims of 1,024, a few thousand lookups a sample)
MAX_ROWS = 2**40
MAX_DIM = 2**16
MAX_POOLING = 1e6
MAX_BATCH = 2**24
