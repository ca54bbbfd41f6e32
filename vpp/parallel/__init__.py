"""Who talks to whom: device/backend choice, rank grid and process groups, communication verbs,
tensor-parallel layers, TP attention and expert-parallel MoE."""
