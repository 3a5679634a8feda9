//! The training curve the [`Learner`](crate::learner::Learner) draws: the training
//! loss (a running mean, every step) above the evaluation metric (an accuracy or a
//! held-out loss, at each evaluation), drawn to a PNG with plotters and the vendored
//! DejaVu Sans Mono font (train/assets/, its license beside it).

use kiln_tensor::{Error, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;
use std::sync::Once;

/// The font's bytes, compiled in so a run needs no system fonts.
const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");

/// What a training run records for its curve.
#[derive(Clone, Debug, Default)]
pub struct Curve {
    /// `(step, training loss)`.
    pub loss: Vec<(u64, f64)>,
    /// `(step, metric)` at each evaluation.
    pub metric: Vec<(u64, f64)>,
    /// What the metric is (`test accuracy (%)`, `held-out loss (nats/byte)`).
    pub metric_name: String,
}

impl Curve {
    /// An empty curve whose evaluations measure `metric_name`.
    pub fn new(metric_name: &str) -> Self {
        Curve {
            metric_name: metric_name.to_string(),
            ..Curve::default()
        }
    }

    /// Writes the curve to `path` as a 960×720 PNG titled `title`; a special file at
    /// `path` (a device, a FIFO, a folder) is refused, as every file Kiln writes.
    pub fn write_png(&self, path: &Path, title: &str) -> Result<()> {
        // The drawing library opens `path` itself, so the rule every save applies is
        // checked here (`checkpoint::check_output`).
        crate::checkpoint::check_output("training curve", path)?;
        static FONT_ONCE: Once = Once::new();
        FONT_ONCE.call_once(|| {
            // The font is compiled in and known to parse; a failure would only lose text.
            let _ = register_font("sans-serif", FontStyle::Normal, FONT);
        });
        let err = |e: &dyn std::fmt::Display| {
            Error::Format(format!(
                "cannot draw the training curve {}: {e}",
                path.display()
            ))
        };
        let root = BitMapBackend::new(path, (960, 720)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(title, ("sans-serif", 22))
            .map_err(|e| err(&e))?;
        let (top, bottom) = root.split_vertically(360);
        panel(&top, "training loss (running mean)", &self.loss, &BLUE).map_err(|e| err(&e))?;
        panel(&bottom, &self.metric_name, &self.metric, &RED).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}

/// One panel: `points` against the step, named `what`.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    what: &str,
    points: &[(u64, f64)],
    color: &RGBColor,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let finite: Vec<(u64, f64)> = points.iter().copied().filter(|p| p.1.is_finite()).collect();
    let last = finite.iter().map(|p| p.0).max().unwrap_or(1).max(1);
    let (lo, hi) = finite
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
    let (lo, hi) = if lo.is_finite() {
        let pad = ((hi - lo) * 0.05).max(1e-6);
        (lo - pad, hi + pad)
    } else {
        (0.0, 1.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(what, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0u64..last, lo..hi)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .label_style(("sans-serif", 14))
        .draw()?;
    chart.draw_series(LineSeries::new(
        finite.iter().copied(),
        color.stroke_width(2),
    ))?;
    if finite.len() < 50 {
        chart.draw_series(finite.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Curve;

    #[test]
    fn a_curve_is_written_as_a_png_of_its_size() {
        let dir = std::env::temp_dir().join(format!("kiln-curve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("curve.png");
        let mut c = Curve::new("test accuracy (%)");
        for s in 0..200u64 {
            c.loss.push((s, 2.3 * (-(s as f64) / 50.0).exp() + 0.1));
        }
        c.metric.push((99, 80.0));
        c.metric.push((199, 90.0));
        c.write_png(&path, "Mlp on MNIST").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, after the chunk's length and type.
        let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((width, height), (960, 720));
        // Text and lines were drawn: a blank white image compresses to far less.
        assert!(bytes.len() > 20_000, "{} bytes", bytes.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
