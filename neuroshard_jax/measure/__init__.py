"""Plans measured on the real kernels: evaluation, the machine's drift, calibration, measured polishing,
explanations, and the comparison suite."""
