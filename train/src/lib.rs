//! # kiln-train
//!
//! Owns what training needs beyond gradients: optimizers, learning-rate schedules and
//! safetensors checkpoints in PyTorch's naming.
