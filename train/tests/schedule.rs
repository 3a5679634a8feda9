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

/// Every schedule against the rates PyTorch's `lr_scheduler` gives for the same
/// settings (train/tests/fixtures/schedules_torch.json, from
/// `scripts/schedule_reference.py`).
#[test]
fn schedules_match_pytorch() {
    use kiln_train::schedule::{
        Anneal, CosineRestarts, Exponential, Lambda, Linear, OneCycle, StepDecay, Warmup,
    };
    let text = include_str!("fixtures/schedules_torch.json");
    let doc: serde_json::Value = serde_json::from_str(text).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for case in cases {
        let p = &case["params"];
        let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k} in {p}"));
        let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
        let name = case["schedule"].as_str().unwrap();
        let schedule: Box<dyn Schedule> = match name {
            "step" => Box::new(StepDecay::new(f("base"), n("step_size"), f("gamma")).unwrap()),
            "exponential" => Box::new(Exponential::new(f("base"), f("gamma")).unwrap()),
            "cosine_restarts" => {
                Box::new(CosineRestarts::new(f("base"), f("min_lr"), n("t0"), n("t_mult")).unwrap())
            }
            "one_cycle" => Box::new(
                OneCycle {
                    pct_start: f("pct_start"),
                    div_factor: f("div"),
                    final_div_factor: f("final_div"),
                    anneal: match p["anneal"].as_str().unwrap() {
                        "cos" => Anneal::Cos,
                        _ => Anneal::Linear,
                    },
                    three_phase: p["three_phase"].as_bool().unwrap(),
                    ..OneCycle::new(f("max_lr"), n("total")).unwrap()
                }
                .checked()
                .unwrap(),
            ),
            "linear" => Box::new(
                Linear::new(f("base"), f("start_factor"), f("end_factor"), n("total")).unwrap(),
            ),
            "lambda_power" => {
                let k = f("k");
                Box::new(Lambda::new(f("base"), move |s| k.powi(s as i32)).unwrap())
            }
            "warmup_exponential" => Box::new(
                Warmup::new(
                    Exponential::new(f("base"), f("gamma")).unwrap(),
                    f("start_factor"),
                    n("warmup"),
                )
                .unwrap(),
            ),
            other => panic!("no schedule for the fixture's `{other}`"),
        };
        seen.insert(name);
        for (step, want) in case["rates"].as_array().unwrap().iter().enumerate() {
            let want = want.as_f64().unwrap();
            let got = schedule.lr_at(step as u64);
            assert!(
                (got - want).abs() <= 1e-12 * want.abs().max(1e-3),
                "{name} {p} at step {step}: {got} against PyTorch's {want}"
            );
        }
    }
    assert_eq!(
        seen.len(),
        7,
        "the fixture covers every schedule but Constant: {seen:?}"
    );
}

#[test]
fn schedules_refuse_nonsense_settings() {
    use kiln_train::schedule::{CosineRestarts, Exponential, Linear, OneCycle, StepDecay, Warmup};
    let message = |r: kiln_tensor::Error| r.to_string();
    assert!(
        message(StepDecay::new(0.1, 0, 0.5).unwrap_err()).contains("step_size must be at least 1")
    );
    assert!(message(StepDecay::new(0.1, 3, f64::NAN).unwrap_err()).contains("gamma"));
    assert!(message(Exponential::new(-1.0, 0.9).unwrap_err()).contains("base_lr"));
    assert!(message(CosineRestarts::new(0.1, 0.2, 5, 1).unwrap_err()).contains("must not exceed"));
    assert!(message(CosineRestarts::new(0.1, 0.0, 0, 1).unwrap_err()).contains("first_cycle"));
    assert!(message(CosineRestarts::new(0.1, 0.0, 5, 0).unwrap_err()).contains("cycle_mult"));
    assert!(message(OneCycle::new(0.1, 2).unwrap_err()).contains("shorter than one step"));
    let bad_pct = OneCycle {
        pct_start: 1.0,
        ..OneCycle::new(0.1, 100).unwrap()
    };
    assert!(message(bad_pct.checked().unwrap_err()).contains("pct_start"));
    let bad_div = OneCycle {
        div_factor: 0.0,
        ..OneCycle::new(0.1, 100).unwrap()
    };
    assert!(message(bad_div.checked().unwrap_err()).contains("div_factor"));
    assert!(message(Linear::new(0.1, 0.0, 1.0, 5).unwrap_err()).contains("start_factor"));
    assert!(message(Linear::new(0.1, 0.5, 1.5, 5).unwrap_err()).contains("end_factor"));
    assert!(message(Linear::new(0.1, 0.5, 1.0, 0).unwrap_err()).contains("total_steps"));
    let inner = Exponential::new(0.1, 0.9).unwrap();
    assert!(message(Warmup::new(inner, 2.0, 5).unwrap_err()).contains("start_factor"));
}

#[test]
fn schedules_at_far_steps_stay_finite() {
    use kiln_train::schedule::{CosineRestarts, OneCycle, StepDecay, Warmup};
    let far = [u64::MAX, u64::MAX / 2, 1 << 40];
    let restarts = CosineRestarts::new(0.1, 0.001, 3, 2).unwrap();
    let one_cycle = OneCycle::new(0.1, 100).unwrap();
    let decay = StepDecay::new(0.1, 1, 0.5).unwrap();
    let warm = Warmup::new(decay, 0.1, 10).unwrap();
    for step in far {
        for lr in [
            restarts.lr_at(step),
            one_cycle.lr_at(step),
            decay.lr_at(step),
            warm.lr_at(step),
        ] {
            assert!(lr.is_finite() && lr >= 0.0, "{lr} at {step}");
        }
    }
    // Past its last step one-cycle stays at its final rate.
    assert_eq!(one_cycle.lr_at(99), one_cycle.lr_at(10_000));
}
