//! Learning-rate schedules at their key steps.

use kiln_train::schedule::{Constant, CosineWithWarmup, Schedule};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn cosine_with_warmup_key_steps() {
    let s = CosineWithWarmup::new(1.0, 0.1, 10, 110).unwrap();
    let want = [
        (0, 0.0),
        (1, 0.1),
        (5, 0.5),
        (9, 0.9),
        (10, 1.0), // warm-up done
        (
            35,
            0.1 + 0.9 * 0.5 * (1.0 + std::f64::consts::FRAC_PI_4.cos()),
        ), // a quarter of the cosine
        (60, 0.55), // half way: the mean of base and min
        (
            109,
            0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * 0.99).cos()),
        ),
        (110, 0.1),
        (1_000_000, 0.1), // constant after the end
    ];
    for (step, lr) in want {
        assert!(
            close(s.lr_at(step), lr),
            "step {step}: {} instead of {lr}",
            s.lr_at(step)
        );
    }
    // Monotone: up during warm-up, down after.
    for step in 0..10 {
        assert!(s.lr_at(step) < s.lr_at(step + 1));
    }
    for step in 10..110 {
        assert!(s.lr_at(step) > s.lr_at(step + 1));
    }
}

#[test]
fn cosine_without_warmup_starts_at_base() {
    let s = CosineWithWarmup::new(3e-4, 0.0, 0, 100).unwrap();
    assert_eq!(s.lr_at(0), 3e-4);
    assert!(close(s.lr_at(50), 1.5e-4));
    assert_eq!(s.lr_at(100), 0.0);
}

#[test]
fn degenerate_schedules_never_panic() {
    // Warm-up as long as the run: it ramps, then drops to min_lr.
    let s = CosineWithWarmup::new(1.0, 0.25, 4, 4).unwrap();
    assert_eq!(s.lr_at(2), 0.5);
    assert_eq!(s.lr_at(4), 0.25);
    // Fields set by hand past what `new` accepts: still defined.
    let s = CosineWithWarmup {
        base_lr: 1.0,
        min_lr: 0.0,
        warmup_steps: 0,
        total_steps: 0,
    };
    assert_eq!(s.lr_at(0), 0.0);
    let s = CosineWithWarmup {
        base_lr: 1.0,
        min_lr: 0.0,
        warmup_steps: 10,
        total_steps: 5,
    };
    assert_eq!(s.lr_at(7), 0.7);
    assert_eq!(s.lr_at(10), 0.0);
}

#[test]
fn invalid_schedules_are_errors() {
    assert!(CosineWithWarmup::new(-1.0, 0.0, 0, 10).is_err());
    assert!(CosineWithWarmup::new(1.0, f64::NAN, 0, 10).is_err());
    assert!(CosineWithWarmup::new(0.1, 0.2, 0, 10).is_err());
    let e = CosineWithWarmup::new(1.0, 0.0, 11, 10)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("warmup_steps (11)") && e.contains("total_steps (10)"),
        "{e}"
    );
    assert!(Constant::new(-0.1).is_err());
    assert!(Constant::new(f64::INFINITY).is_err());
}

#[test]
fn constant_is_constant() {
    let s = Constant::new(0.01).unwrap();
    assert_eq!([s.lr_at(0), s.lr_at(1), s.lr_at(u64::MAX)], [0.01; 3]);
}
