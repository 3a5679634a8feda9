//! Metrics on the device against the same quantities computed on the host (scikit-
//! learn's definitions), over several batches, with ties, NaN scores, sequences and
//! targets out of range.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{RawTensor, Result};
use kiln_train::metrics::{Accuracy, Averaged, ClassCounts, MeanLoss, Metric, Outputs, TopK};

type T = RawTensor<Cpu>;

fn scores(values: Vec<f32>, dims: &[usize]) -> T {
    RawTensor::from_vec(values, dims, &CpuDevice).unwrap()
}

fn targets(values: Vec<i32>, dims: &[usize]) -> T {
    RawTensor::from_vec(values, dims, &CpuDevice).unwrap()
}

fn feed(m: &mut dyn Metric<Cpu>, s: &T, t: &T) -> Result<()> {
    m.update(&Outputs {
        scores: Some(s),
        targets: Some(t),
        loss: None,
    })
}

/// A small generator so the test needs no dependency.
fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32) / (1u64 << 24) as f32
}

/// Host reference: top-k hits (fewer than k strictly higher, target not NaN) and the
/// macro precision, recall and F1 over classes that occur.
fn reference(batches: &[(Vec<f32>, Vec<i32>)], classes: usize, k: usize) -> (f64, [f64; 3]) {
    let (mut hits, mut n) = (0usize, 0usize);
    let (mut tp, mut pred, mut act) = (vec![0.0; classes], vec![0.0; classes], vec![0.0; classes]);
    for (s, t) in batches {
        for (i, &y) in t.iter().enumerate() {
            let row = &s[i * classes..(i + 1) * classes];
            let ty = row[y as usize];
            let higher = row.iter().filter(|&&v| v > ty).count();
            hits += (higher < k && !ty.is_nan()) as usize;
            n += 1;
            // argmax: the first of the highest (NaN handling aside, none here).
            let p = (0..classes).fold(0, |b, c| if row[c] > row[b] { c } else { b });
            pred[p] += 1.0;
            act[y as usize] += 1.0;
            if p == y as usize {
                tp[p] += 1.0;
            }
        }
    }
    let r = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let (mut sums, mut m) = ([0.0; 3], 0.0);
    for c in 0..classes {
        if pred[c] + act[c] == 0.0 {
            continue;
        }
        let (p, rc) = (r(tp[c], pred[c]), r(tp[c], act[c]));
        sums[0] += p;
        sums[1] += rc;
        sums[2] += r(2.0 * p * rc, p + rc);
        m += 1.0;
    }
    (hits as f64 / n as f64, sums.map(|v| v / m))
}

#[test]
fn metrics_match_the_host_reference_over_batches() {
    let classes = 6;
    let mut seed = 3;
    let batches: Vec<(Vec<f32>, Vec<i32>)> = [7usize, 12, 1, 9]
        .iter()
        .map(|&n| {
            // Scores rounded to tenths, so ties happen.
            let s = (0..n * classes)
                .map(|_| (lcg(&mut seed) * 10.0).round() / 10.0)
                .collect();
            let t = (0..n).map(|_| (lcg(&mut seed) * 5.0) as i32).collect();
            (s, t)
        })
        .collect();
    for k in [1, 2, 5] {
        let mut m = TopK::<Cpu>::new(k).unwrap();
        for (s, t) in &batches {
            feed(
                &mut m,
                &scores(s.clone(), &[t.len(), classes]),
                &targets(t.clone(), &[t.len()]),
            )
            .unwrap();
        }
        let (want, _) = reference(&batches, classes, k);
        assert!((m.value().unwrap() - want).abs() < 1e-12, "top{k}");
    }
    let (_, [p, r, f]) = reference(&batches, classes, 1);
    for (report, want) in [
        (Averaged::Precision, p),
        (Averaged::Recall, r),
        (Averaged::F1, f),
    ] {
        let mut m = ClassCounts::<Cpu>::new(report);
        for (s, t) in &batches {
            feed(
                &mut m,
                &scores(s.clone(), &[t.len(), classes]),
                &targets(t.clone(), &[t.len()]),
            )
            .unwrap();
        }
        assert!(
            (m.value().unwrap() - want).abs() < 1e-12,
            "{report:?}: {} against {want}",
            m.value().unwrap()
        );
    }
    // After a reset, only what follows counts.
    let mut acc = Accuracy::<Cpu>::accuracy();
    feed(
        &mut acc,
        &scores(vec![0.0, 1.0], &[1, 2]),
        &targets(vec![0], &[1]),
    )
    .unwrap();
    acc.reset();
    assert!(acc.value().unwrap_err().to_string().contains("no batch"));
    feed(
        &mut acc,
        &scores(vec![0.0, 1.0], &[1, 2]),
        &targets(vec![1], &[1]),
    )
    .unwrap();
    assert_eq!(acc.value().unwrap(), 1.0);
}

#[test]
fn sequences_nan_scores_and_bad_targets() {
    // Tokens: scores [2, 3, 4], targets [2, 3].
    let s: Vec<f32> = (0..24).map(|v| ((v * 7) % 5) as f32).collect();
    let t = vec![0, 1, 2, 3, 0, 1];
    let mut acc = Accuracy::<Cpu>::accuracy();
    feed(
        &mut acc,
        &scores(s.clone(), &[2, 3, 4]),
        &targets(t.clone(), &[2, 3]),
    )
    .unwrap();
    let (want, _) = reference(&[(s, t)], 4, 1);
    assert_eq!(acc.value().unwrap(), want);

    // A NaN score at the target is a miss, wherever it is.
    let mut acc = Accuracy::<Cpu>::accuracy();
    feed(
        &mut acc,
        &scores(vec![f32::NAN, 0.0, 1.0, 0.0], &[2, 2]),
        &targets(vec![0, 0], &[2]),
    )
    .unwrap();
    assert_eq!(acc.value().unwrap(), 0.5);

    // Targets out of range: updates go on (nothing is read), the value is an error.
    for mut m in [
        Box::new(Accuracy::<Cpu>::accuracy()) as Box<dyn Metric<Cpu>>,
        Box::new(ClassCounts::<Cpu>::new(Averaged::F1)),
    ] {
        feed(
            &mut *m,
            &scores(vec![0.0; 6], &[2, 3]),
            &targets(vec![3, -1], &[2]),
        )
        .unwrap();
        let e = m.value().unwrap_err().to_string();
        assert!(e.contains("2 target(s) outside the 3 classes 0..3"), "{e}");
    }
    // Shapes and dtypes that do not pair up: named as what a classification metric reads.
    let mut acc = Accuracy::<Cpu>::accuracy();
    for (s, t, want) in [
        (
            scores(vec![0.0; 6], &[2, 3]),
            targets(vec![0; 3], &[3]),
            "is a classification metric",
        ),
        (
            scores(vec![0.0; 6], &[2, 3]),
            scores(vec![0.0; 2], &[2]),
            "is a classification metric",
        ),
        (
            targets(vec![0; 6], &[2, 3]),
            targets(vec![0; 2], &[2]),
            "is a classification metric",
        ),
    ] {
        let e = feed(&mut acc, &s, &t).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let e = acc
        .update(&Outputs {
            scores: None,
            targets: None,
            loss: None,
        })
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("accuracy needs the batch's scores and targets"),
        "{e}"
    );
    let mut top5 = TopK::<Cpu>::new(5).unwrap();
    let e = feed(
        &mut top5,
        &scores(vec![0.0; 6], &[2, 3]),
        &targets(vec![0, 1], &[2]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("top5: the top 5 of 3 classes"), "{e}");
    assert!(TopK::<Cpu>::new(0)
        .unwrap_err()
        .to_string()
        .contains("k must be at least 1"));
}

#[test]
fn mean_loss_and_perplexity_weigh_batches_by_their_items() {
    let mut loss = MeanLoss::<Cpu>::new();
    let mut ppl = MeanLoss::<Cpu>::perplexity();
    for (l, n) in [(2.0f32, 10usize), (1.0, 30)] {
        let t = scores(vec![l], &[]);
        for m in [&mut loss, &mut ppl] {
            m.update(&Outputs {
                scores: None,
                targets: None,
                loss: Some((&t, n)),
            })
            .unwrap();
        }
    }
    assert!((loss.value().unwrap() - 1.25).abs() < 1e-12);
    assert!((ppl.value().unwrap() - 1.25f64.exp()).abs() < 1e-9);
    let e = loss
        .update(&Outputs {
            scores: None,
            targets: None,
            loss: Some((&scores(vec![1.0, 2.0], &[2]), 2)),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("the loss must be one float"), "{e}");
    assert_eq!(Metric::<Cpu>::name(&ppl), "perplexity");
}
