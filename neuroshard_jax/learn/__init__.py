"""Learning from measurements: label collection, cost-model training and fits, plan labels, the
pre-train/search/measure/learn loop, and RL policy training."""
