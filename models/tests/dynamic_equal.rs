//! The dynamic path equals the static path for every model of the crate, on the CPU
//! (see tests/support/dynamic_equal.rs for what is compared and the tolerance).

use kiln::cpu::{Cpu, CpuDevice};
use proptest::prelude::*;

#[path = "support/dynamic_equal.rs"]
mod equal;

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn mlp(seed in 0u64..1000) { equal::mlp::<Cpu>(&CpuDevice, seed) }

    #[test]
    fn lenet(seed in 0u64..1000) { equal::lenet::<Cpu>(&CpuDevice, seed) }

    #[test]
    fn residual_mlp(seed in 0u64..1000) { equal::residual::<Cpu>(&CpuDevice, seed) }

    #[test]
    fn attention(seed in 0u64..1000) { equal::attention::<Cpu>(&CpuDevice, seed) }

    #[test]
    fn gpt(seed in 0u64..1000) { equal::gpt::<Cpu>(&CpuDevice, seed) }

    #[test]
    fn hybrid_once(seed in 0u64..1000) { equal::hybrid::<Cpu>(&CpuDevice, seed, equal::HybridCase::Once) }

    #[test]
    fn hybrid_twice(seed in 0u64..1000) { equal::hybrid::<Cpu>(&CpuDevice, seed, equal::HybridCase::Twice) }

    #[test]
    fn hybrid_deep(seed in 0u64..1000) { equal::hybrid::<Cpu>(&CpuDevice, seed, equal::HybridCase::Deep) }
}
