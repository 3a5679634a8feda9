//! Kiln's GPU system tests and benchmark, kept out of the backend crate so that
//! `kiln-cubecl`'s own tests build without the model zoo: `tests/` trains, plans and
//! replays the zoo's models on wgpu and CUDA against their op-by-op paths and the CPU,
//! and `examples/gpu_bench.rs` times the GPU workloads (W1–W4) beside PyTorch's
//! (`scripts/bench_gpu.py`). The library itself is empty.
