//! The backend conformance suite of `kiln_tensor::testing`, run on the CPU backend with
//! every dtype: each op against the f64 reference interpreter over random shapes,
//! layouts and values, the composites against their formulas, and bad shapes.

kiln_tensor::conformance_tests!(kiln_cpu::Cpu, kiln_cpu::CpuDevice);
