//! The plan cache: a new batch size reuses the plan (the only test of this binary, so
//! the counters are its own), and the capacity bounds the programs kept.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_dynamic::{cache_stats, set_cache_capacity, LazyTensor};
use kiln_tensor::{DType, RawTensor};

fn a_new_batch_size_reuses_the_plan_inner() {
    let dev = CpuDevice;
    let w = LazyTensor::<Cpu>::from_raw(RawTensor::full(&[5, 3], 0.5, DType::F32, &dev).unwrap());
    let run = |n: usize| {
        let x =
            LazyTensor::<Cpu>::from_raw(RawTensor::full(&[n, 5], 1.0, DType::F32, &dev).unwrap());
        let y = x.matmul(&w).unwrap().relu().unwrap().mean_all().unwrap();
        y.scalar_value().unwrap()
    };
    let before = cache_stats::<Cpu>();
    assert_eq!(run(7), 2.5);
    let after_first = cache_stats::<Cpu>();
    assert_eq!(run(11), 2.5);
    assert_eq!(run(13), 2.5);
    let after = cache_stats::<Cpu>();
    assert_eq!(
        after_first.misses - before.misses,
        1,
        "the first batch size plans"
    );
    assert_eq!(
        after.misses, after_first.misses,
        "other batch sizes reuse the plan"
    );
    assert!(after.hits >= after_first.hits + 2);
}

/// One test: the counters are shared by the process.
#[test]
fn plans_are_reused_and_bounded() {
    a_new_batch_size_reuses_the_plan_inner();
    set_cache_capacity::<Cpu>(2).unwrap();
    assert!(set_cache_capacity::<Cpu>(0).is_err());
    let dev = CpuDevice;
    let x = LazyTensor::<Cpu>::from_raw(RawTensor::full(&[4], 2.0, DType::F32, &dev).unwrap());
    // Three different constants: three graphs, so one program is evicted.
    for c in [1.0, 2.0, 3.0] {
        assert_eq!(
            x.add_scalar(c).unwrap().to_vec::<f32>().unwrap(),
            vec![2.0 + c as f32; 4]
        );
    }
    let s = cache_stats::<Cpu>();
    assert_eq!(s.programs, 2);
    assert!(s.evictions >= 2, "{s}");
}
