//! Evaluation metrics, accumulated on the device where the model's outputs are: each
//! batch adds to a few device tensors (counts, sums), and only [`Metric::value`] reads
//! back, once. [`Accuracy`], [`TopK`], [`MeanLoss`], [`Perplexity`] and [`ClassCounts`]
//! (macro-averaged precision, recall and F1, as scikit-learn's `average="macro"`
//! computes them).
//!
//! A batch's outputs are class scores of dims `[.., classes]` and `i32` targets of the
//! dims before the classes (`[n]` for images, `[n, t]` for tokens), or a loss. Targets
//! outside `0..classes` are counted on the device and make [`Metric::value`] an error.

use kiln_tensor::{Backend, BinaryOp, BuilderExt, CmpOp, DType, Error, RawTensor, Result};

/// What a metric reads from one batch.
#[derive(Clone, Copy, Debug)]
pub struct Outputs<'a, B: Backend> {
    /// Class scores (logits), dims `[.., classes]`.
    pub scores: Option<&'a RawTensor<B>>,
    /// Integer targets, dims of the scores without the last.
    pub targets: Option<&'a RawTensor<B>>,
    /// The batch's mean loss (a scalar) and how many items it is the mean of.
    pub loss: Option<(&'a RawTensor<B>, usize)>,
}

/// A quantity accumulated over batches.
pub trait Metric<B: Backend> {
    /// Its name in reports: `accuracy`, `top5`, `loss`, `perplexity`, `f1`.
    fn name(&self) -> String;
    /// Adds one batch (nothing is read back).
    fn update(&mut self, outputs: &Outputs<'_, B>) -> Result<()>;
    /// The value over the batches since the last reset (reads the device once); an
    /// error before any batch, or when a target was out of range.
    fn value(&self) -> Result<f64>;
    /// Forgets the batches.
    fn reset(&mut self);
}

/// `a + b`, where `a` may not exist yet.
fn accumulate<B: Backend>(a: &mut Option<RawTensor<B>>, b: RawTensor<B>) -> Result<()> {
    *a = Some(match a.take() {
        None => b,
        Some(a) => a.ops().add(&a, &b)?,
    });
    Ok(())
}

/// Scores `[n, classes]` and targets `[n]` of a batch, checked against each other, and
/// a device count of the targets out of range.
struct Flat<B: Backend> {
    scores: RawTensor<B>,
    targets: RawTensor<B>,
    out_of_range: RawTensor<B>,
    n: usize,
    classes: usize,
}

/// The words of a metric's refusal, without the op it came from.
pub(crate) fn why(e: &Error) -> String {
    match e {
        Error::Shape { msg, .. } | Error::DType { msg, .. } | Error::Invalid { msg, .. } => {
            msg.clone()
        }
        other => other.to_string(),
    }
}

fn flat<B: Backend>(metric: &str, o: &Outputs<'_, B>) -> Result<Flat<B>> {
    let (Some(scores), Some(targets)) = (o.scores, o.targets) else {
        return Err(Error::invalid(
            "Metric::update",
            format!("{metric} needs the batch's scores and targets"),
        ));
    };
    let dims = scores.dims().to_vec();
    let shape_error = || {
        Error::shape(
            "Metric::update",
            format!(
                "{metric} is a classification metric: it reads class scores [.., classes] \
                 (floats) and integer class ids with the scores' dims without the last, \
                 but got scores {} {:?} and targets {} {:?}{}",
                scores.dtype(),
                dims,
                targets.dtype(),
                targets.dims().to_vec(),
                match targets.dtype().is_float() {
                    true => " (float targets: a regression model, measured by its loss)",
                    false => "",
                }
            ),
        )
    };
    if dims.is_empty() || !scores.dtype().is_float() || targets.dtype() != DType::I32 {
        return Err(shape_error());
    }
    let classes = dims[dims.len() - 1];
    if targets.dims().to_vec() != dims[..dims.len() - 1] || classes == 0 {
        return Err(shape_error());
    }
    let n = targets.numel();
    let scores = scores.reshape(&[n, classes])?;
    let targets = targets.reshape(&[n])?;
    let dev = targets.device().clone();
    let below = targets.compare(CmpOp::Lt, &RawTensor::full(&[1], 0.0, DType::I32, &dev)?)?;
    let above = targets.compare(
        CmpOp::Ge,
        &RawTensor::full(&[1], classes as f64, DType::I32, &dev)?,
    )?;
    let out_of_range = below
        .cast(DType::I32)?
        .ops()
        .add(&below.cast(DType::I32)?, &above.cast(DType::I32)?)?
        .sum(&[0], false)?;
    Ok(Flat {
        scores,
        targets,
        out_of_range,
        n,
        classes,
    })
}

/// Reads a count accumulated on the device.
fn read(t: &Option<RawTensor<impl Backend>>) -> Result<f64> {
    match t {
        Some(t) => t.scalar_value(),
        None => Ok(0.0),
    }
}

/// The error for targets outside `0..classes`.
fn check_range<B: Backend>(metric: &str, bad: &Option<RawTensor<B>>, classes: usize) -> Result<()> {
    let bad = read(bad)?;
    if bad > 0.0 {
        return Err(Error::invalid(
            "Metric::value",
            format!("{metric}: {bad} target(s) outside the {classes} classes 0..{classes}"),
        ));
    }
    Ok(())
}

fn no_batches(metric: &str) -> Error {
    Error::invalid(
        "Metric::value",
        format!("{metric} has seen no batch since it was reset"),
    )
}

/// The fraction of items whose highest score is their target's.
#[derive(Clone, Debug)]
pub struct TopK<B: Backend> {
    k: usize,
    hits: Option<RawTensor<B>>,
    out_of_range: Option<RawTensor<B>>,
    count: usize,
    classes: usize,
}

/// Top-1 accuracy.
pub type Accuracy<B> = TopK<B>;

impl<B: Backend> TopK<B> {
    /// The fraction of items whose target is among their `k` highest scores (an error
    /// for `k` = 0). Ties go to the target: an item counts when fewer than `k` classes
    /// score strictly higher; a target whose score is NaN is a miss.
    pub fn new(k: usize) -> Result<Self> {
        if k == 0 {
            return Err(Error::invalid("TopK", "k must be at least 1"));
        }
        Ok(TopK {
            k,
            hits: None,
            out_of_range: None,
            count: 0,
            classes: 0,
        })
    }

    /// Top-1 accuracy.
    pub fn accuracy() -> Self {
        Self::new(1).expect("1 is a valid k")
    }
}

impl<B: Backend> Metric<B> for TopK<B> {
    fn name(&self) -> String {
        match self.k {
            1 => "accuracy".into(),
            k => format!("top{k}"),
        }
    }

    #[inline(never)]
    fn update(&mut self, o: &Outputs<'_, B>) -> Result<()> {
        let f = flat(&self.name(), o)?;
        if self.k > f.classes {
            return Err(Error::invalid(
                "Metric::update",
                format!(
                    "{}: the top {} of {} classes",
                    self.name(),
                    self.k,
                    f.classes
                ),
            ));
        }
        let dev = f.targets.device().clone();
        // Targets clamped into range for the gather; those out of range are counted
        // apart and make `value` an error.
        let safe = f.targets.ops().binary(
            BinaryOp::Max,
            &f.targets,
            &RawTensor::full(&[1], 0.0, DType::I32, &dev)?,
        )?;
        let safe = safe.ops().binary(
            BinaryOp::Min,
            &safe,
            &RawTensor::full(&[1], (f.classes - 1) as f64, DType::I32, &dev)?,
        )?;
        let target_score = f.scores.gather(1, &safe.reshape(&[f.n, 1])?)?;
        let higher = f
            .scores
            .compare(CmpOp::Gt, &target_score)?
            .cast(DType::I32)?
            .sum(&[1], false)?;
        let within = higher.compare(
            CmpOp::Lt,
            &RawTensor::full(&[1], self.k as f64, DType::I32, &dev)?,
        )?;
        let finite = target_score
            .compare(CmpOp::Eq, &target_score)?
            .reshape(&[f.n])?;
        let hit = within.cast(DType::I32)?;
        let hit = hit
            .ops()
            .mul(&hit, &finite.cast(DType::I32)?)?
            .sum(&[0], false)?;
        accumulate(&mut self.hits, hit)?;
        accumulate(&mut self.out_of_range, f.out_of_range)?;
        self.count += f.n;
        self.classes = f.classes;
        Ok(())
    }

    #[inline(never)]
    fn value(&self) -> Result<f64> {
        if self.count == 0 {
            return Err(no_batches(&self.name()));
        }
        check_range(&self.name(), &self.out_of_range, self.classes)?;
        Ok(read(&self.hits)? / self.count as f64)
    }

    fn reset(&mut self) {
        (self.hits, self.out_of_range, self.count) = (None, None, 0);
    }
}

/// The mean of the batches' losses, each weighted by how many items it averages.
#[derive(Clone, Debug)]
pub struct MeanLoss<B: Backend> {
    sum: Option<RawTensor<B>>,
    count: usize,
    exp: bool,
}

/// `exp` of the mean per-token loss (a language model's perplexity).
pub type Perplexity<B> = MeanLoss<B>;

impl<B: Backend> MeanLoss<B> {
    /// The mean loss.
    pub fn new() -> Self {
        MeanLoss {
            sum: None,
            count: 0,
            exp: false,
        }
    }

    /// `exp` of the mean loss: perplexity, when the loss is a mean token
    /// cross-entropy in nats.
    pub fn perplexity() -> Self {
        MeanLoss {
            exp: true,
            ..Self::new()
        }
    }
}

impl<B: Backend> Default for MeanLoss<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> Metric<B> for MeanLoss<B> {
    fn name(&self) -> String {
        match self.exp {
            true => "perplexity".into(),
            false => "loss".into(),
        }
    }

    #[inline(never)]
    fn update(&mut self, o: &Outputs<'_, B>) -> Result<()> {
        let Some((loss, items)) = o.loss else {
            return Err(Error::invalid(
                "Metric::update",
                format!("{} needs the batch's loss", self.name()),
            ));
        };
        if loss.numel() != 1 || !loss.dtype().is_float() {
            return Err(Error::shape(
                "Metric::update",
                format!(
                    "{}: the loss must be one float, got {} {:?}",
                    self.name(),
                    loss.dtype(),
                    loss.dims().to_vec()
                ),
            ));
        }
        let weighted = loss
            .cast(DType::F32)?
            .reshape(&[1])?
            .mul_scalar(items as f64)?;
        accumulate(&mut self.sum, weighted)?;
        self.count += items;
        Ok(())
    }

    #[inline(never)]
    fn value(&self) -> Result<f64> {
        if self.count == 0 {
            return Err(no_batches(&self.name()));
        }
        let mean = read(&self.sum)? / self.count as f64;
        Ok(if self.exp { mean.exp() } else { mean })
    }

    fn reset(&mut self) {
        (self.sum, self.count) = (None, 0);
    }
}

/// Which value of [`ClassCounts`] it reports as its [`Metric::value`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Averaged {
    /// Macro-averaged precision.
    Precision,
    /// Macro-averaged recall.
    Recall,
    /// Macro-averaged F1.
    F1,
}

/// Per-class counts of predictions (the highest score), targets and their agreement,
/// for precision, recall and F1 averaged over the classes that occur as a target or a
/// prediction (a class never predicted has precision 0, as scikit-learn's
/// `zero_division=0`).
#[derive(Clone, Debug)]
pub struct ClassCounts<B: Backend> {
    report: Averaged,
    /// `[classes]` counts: true positives, predictions, targets.
    counts: Option<[RawTensor<B>; 3]>,
    out_of_range: Option<RawTensor<B>>,
    classes: usize,
}

impl<B: Backend> ClassCounts<B> {
    /// Counts reporting `report`.
    pub fn new(report: Averaged) -> Self {
        ClassCounts {
            report,
            counts: None,
            out_of_range: None,
            classes: 0,
        }
    }

    /// Macro-averaged precision, recall and F1 (one read of the device).
    pub fn averages(&self) -> Result<(f64, f64, f64)> {
        let Some([tp, predicted, actual]) = &self.counts else {
            return Err(no_batches("precision/recall/F1"));
        };
        check_range("precision/recall/F1", &self.out_of_range, self.classes)?;
        let (tp, predicted, actual) = (
            tp.to_f64_vec()?,
            predicted.to_f64_vec()?,
            actual.to_f64_vec()?,
        );
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let (mut p, mut r, mut f, mut n) = (0.0, 0.0, 0.0, 0.0);
        for c in 0..tp.len() {
            if predicted[c] == 0.0 && actual[c] == 0.0 {
                continue;
            }
            let (pc, rc) = (ratio(tp[c], predicted[c]), ratio(tp[c], actual[c]));
            p += pc;
            r += rc;
            f += ratio(2.0 * pc * rc, pc + rc);
            n += 1.0;
        }
        Ok((p / n, r / n, f / n))
    }
}

impl<B: Backend> Metric<B> for ClassCounts<B> {
    fn name(&self) -> String {
        match self.report {
            Averaged::Precision => "precision",
            Averaged::Recall => "recall",
            Averaged::F1 => "f1",
        }
        .into()
    }

    #[inline(never)]
    fn update(&mut self, o: &Outputs<'_, B>) -> Result<()> {
        let f = flat(&self.name(), o)?;
        if self.counts.is_some() && f.classes != self.classes {
            return Err(Error::shape(
                "Metric::update",
                format!(
                    "{}: {} classes after batches of {}",
                    self.name(),
                    f.classes,
                    self.classes
                ),
            ));
        }
        let dev = f.targets.device().clone();
        let labels: Vec<i32> = (0..f.classes as i32).collect();
        let labels = RawTensor::from_vec(labels, &[1, f.classes], &dev)?;
        let one_hot = |ids: &RawTensor<B>| -> Result<RawTensor<B>> {
            ids.reshape(&[f.n, 1])?
                .compare(CmpOp::Eq, &labels)?
                .cast(DType::I32)
        };
        let predicted = one_hot(&f.scores.argmax(1, false)?.cast(DType::I32)?)?;
        let actual = one_hot(&f.targets)?;
        let tp = predicted.ops().mul(&predicted, &actual)?.sum(&[0], false)?;
        let batch = [tp, predicted.sum(&[0], false)?, actual.sum(&[0], false)?];
        self.counts = Some(match self.counts.take() {
            None => batch,
            Some(acc) => {
                let [a, b, c] = acc;
                let [x, y, z] = batch;
                [
                    a.ops().add(&a, &x)?,
                    b.ops().add(&b, &y)?,
                    c.ops().add(&c, &z)?,
                ]
            }
        });
        accumulate(&mut self.out_of_range, f.out_of_range)?;
        self.classes = f.classes;
        Ok(())
    }

    #[inline(never)]
    fn value(&self) -> Result<f64> {
        let (p, r, f) = self.averages()?;
        Ok(match self.report {
            Averaged::Precision => p,
            Averaged::Recall => r,
            Averaged::F1 => f,
        })
    }

    fn reset(&mut self) {
        (self.counts, self.out_of_range) = (None, None);
    }
}
