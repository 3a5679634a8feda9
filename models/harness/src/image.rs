//! Image files a user gives the classifiers, turned into what the zoo's MNIST-style
//! models take: 28×28, a light figure on a dark background, normalised as in training.
//! The files are read by [`kiln::data::image`] (PNG, JPEG, PGM; bounded readers).

pub use kiln::data::image::{GreyImage, MAX_FILE_BYTES, MAX_PIXELS};
use kiln::tensor::Result;
use std::path::Path;

/// The side of the square the classifiers take.
pub const SIDE: usize = 28;

/// Reads the PNG, JPEG or PGM file at `path` as a grey image: colour turned to
/// luminance, transparency composited over white.
pub fn read_image(path: &Path) -> Result<GreyImage> {
    Ok(kiln::data::image::read_image(path)?.grey())
}

/// How an image is framed in the 28×28 square the classifiers take: as its data set
/// framed its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// MNIST's: the figure's bounding box scaled to fit a 20×20 box (aspect kept),
    /// then placed so that its centre of mass is the square's centre.
    CentredByMass,
    /// Fashion-MNIST's: the whole image scaled so that its longer side spans 28,
    /// centred.
    Fitted,
}

/// The side of the box MNIST scales its figures into.
const FIGURE_BOX: usize = 20;

/// The 28×28 input a zoo classifier takes from `image`, normalised with `norm`
/// (mean, std) as in training. An image with a light background (the border's mean)
/// is inverted first, since the data sets show light figures on black. A 28×28 image
/// on a dark background is taken as it is (it is in the data set's own form); any
/// other is framed by `framing`, each output pixel averaging the source area it covers.
pub fn classifier_input(image: &GreyImage, norm: (f32, f32), framing: Framing) -> Vec<f32> {
    let (w, h) = (image.width, image.height);
    let border: Vec<f32> = (0..w)
        .flat_map(|x| [image.pixels[x], image.pixels[(h - 1) * w + x]])
        .chain((0..h).flat_map(|y| [image.pixels[y * w], image.pixels[y * w + w - 1]]))
        .collect();
    let border_mean = border.iter().sum::<f32>() / border.len() as f32;
    let light = border_mean > 0.5;
    let at = |x: usize, y: usize| {
        let v = image.pixels[y * w + x];
        if light {
            1.0 - v
        } else {
            v
        }
    };
    let as_is = w == SIDE && h == SIDE && !light;
    let out = match framing {
        Framing::CentredByMass if !as_is => {
            let background = if light { 0.0 } else { border_mean };
            centred_by_mass(w, h, &|x, y| (at(x, y) - background).max(0.0))
        }
        _ => {
            let background = if light { 0.0 } else { border_mean };
            let region = Region { x0: 0, y0: 0, w, h };
            let scale = w.max(h) as f32 / SIDE as f32;
            let (out_w, out_h) = (
                ((w as f32 / scale).round() as usize).clamp(1, SIDE),
                ((h as f32 / scale).round() as usize).clamp(1, SIDE),
            );
            let patch = resample(&at, region, out_w, out_h);
            let mut out = vec![background; SIDE * SIDE];
            let (x0, y0) = ((SIDE - out_w) / 2, (SIDE - out_h) / 2);
            for oy in 0..out_h {
                out[(y0 + oy) * SIDE + x0..(y0 + oy) * SIDE + x0 + out_w]
                    .copy_from_slice(&patch[oy * out_w..(oy + 1) * out_w]);
            }
            out
        }
    };
    let (mean, std) = norm;
    out.iter().map(|v| (v - mean) / std).collect()
}

/// A rectangle of source pixels.
#[derive(Clone, Copy)]
struct Region {
    x0: usize,
    y0: usize,
    w: usize,
    h: usize,
}

/// `region` of the image read by `at`, resampled to `out_w × out_h`: each output pixel
/// averages the source area it covers (exact for shrinking, nearest-like for growing).
fn resample(
    at: &dyn Fn(usize, usize) -> f32,
    region: Region,
    out_w: usize,
    out_h: usize,
) -> Vec<f32> {
    let (sx_scale, sy_scale) = (
        region.w as f32 / out_w as f32,
        region.h as f32 / out_h as f32,
    );
    let mut out = vec![0.0; out_w * out_h];
    for oy in 0..out_h {
        for ox in 0..out_w {
            let sx = (ox as f32 * sx_scale) as usize;
            let sy = (oy as f32 * sy_scale) as usize;
            let ex = (((ox + 1) as f32 * sx_scale).ceil() as usize).clamp(sx + 1, region.w);
            let ey = (((oy + 1) as f32 * sy_scale).ceil() as usize).clamp(sy + 1, region.h);
            let mut sum = 0.0;
            for y in sy..ey {
                for x in sx..ex {
                    sum += at(region.x0 + x, region.y0 + y);
                }
            }
            out[oy * out_w + ox] = sum / ((ex - sx) * (ey - sy)) as f32;
        }
    }
    out
}

/// MNIST's framing of a `w × h` image whose ink (figure minus background, ≥ 0) `ink`
/// reads: the bounding box of the pixels holding at least a quarter of the strongest
/// ink, scaled so its longer side spans [`FIGURE_BOX`], placed with its centre of mass
/// at the square's centre (what falls outside the square is cut). A blank image stays
/// blank.
fn centred_by_mass(w: usize, h: usize, ink: &dyn Fn(usize, usize) -> f32) -> Vec<f32> {
    let mut out = vec![0.0; SIDE * SIDE];
    let peak = (0..h)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .map(|(x, y)| ink(x, y))
        .fold(0.0f32, f32::max);
    if peak <= 0.0 {
        return out;
    }
    let (mut x0, mut y0, mut x1, mut y1) = (w, h, 0, 0);
    for y in 0..h {
        for x in 0..w {
            if ink(x, y) >= 0.25 * peak {
                (x0, y0, x1, y1) = (x0.min(x), y0.min(y), x1.max(x + 1), y1.max(y + 1));
            }
        }
    }
    let (bw, bh) = (x1 - x0, y1 - y0);
    let scale = FIGURE_BOX as f32 / bw.max(bh) as f32;
    let (out_w, out_h) = (
        ((bw as f32 * scale).round() as usize).clamp(1, FIGURE_BOX),
        ((bh as f32 * scale).round() as usize).clamp(1, FIGURE_BOX),
    );
    let region = Region {
        x0,
        y0,
        w: bw,
        h: bh,
    };
    let patch = resample(ink, region, out_w, out_h);
    let total: f32 = patch.iter().sum();
    let (mut cx, mut cy) = (0.0, 0.0);
    // In pixel indices, as MNIST's: its centre of mass lands on index 14 of 0..28.
    for (i, v) in patch.iter().enumerate() {
        cx += v * (i % out_w) as f32;
        cy += v * (i / out_w) as f32;
    }
    let half = SIDE as f32 / 2.0;
    let (dx, dy) = (
        (half - cx / total).round() as isize,
        (half - cy / total).round() as isize,
    );
    for py in 0..out_h {
        for px in 0..out_w {
            let (ox, oy) = (px as isize + dx, py as isize + dy);
            if (0..SIDE as isize).contains(&ox) && (0..SIDE as isize).contains(&oy) {
                out[oy as usize * SIDE + ox as usize] = patch[py * out_w + px];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drawing framed as MNIST frames its digits: a 7 drawn small in a corner of a
    /// large white canvas comes out inverted, its box 20 pixels on its longer side and
    /// its centre of mass on the square's centre; a blank canvas stays blank.
    #[test]
    fn a_drawing_is_centred_by_mass_in_a_20_pixel_box() {
        let (w, h) = (160, 120);
        let mut pixels = vec![1.0f32; w * h];
        // A 7 in the top-left corner: a bar 40 wide, then a stroke down and left.
        for y in 10..16 {
            for x in 10..50 {
                pixels[y * w + x] = 0.0;
            }
        }
        for y in 16..70 {
            let x = 48 - (y - 16) / 3;
            for dx in 0..6 {
                pixels[y * w + x + dx] = 0.0;
            }
        }
        let img = GreyImage {
            width: w,
            height: h,
            pixels,
        };
        let x = classifier_input(&img, (0.0, 1.0), Framing::CentredByMass);
        let inked: Vec<usize> = (0..784).filter(|&i| x[i] > 0.0).collect();
        let rows = inked.iter().map(|i| i / 28).max().unwrap()
            - inked.iter().map(|i| i / 28).min().unwrap()
            + 1;
        let cols = inked.iter().map(|i| i % 28).max().unwrap()
            - inked.iter().map(|i| i % 28).min().unwrap()
            + 1;
        assert_eq!(rows.max(cols), 20, "{rows}×{cols}");
        let total: f32 = x.iter().sum();
        let cx: f32 = x
            .iter()
            .enumerate()
            .map(|(i, v)| v * (i % 28) as f32)
            .sum::<f32>()
            / total;
        let cy: f32 = x
            .iter()
            .enumerate()
            .map(|(i, v)| v * (i / 28) as f32)
            .sum::<f32>()
            / total;
        assert!(
            (cx - 14.0).abs() <= 0.5 && (cy - 14.0).abs() <= 0.5,
            "({cx}, {cy})"
        );
        // Fitting the whole canvas instead leaves the 7 small, in a corner.
        let fitted = classifier_input(&img, (0.0, 1.0), Framing::Fitted);
        let fitted_ink = fitted.iter().filter(|v| **v > 0.0).count();
        assert!(
            fitted_ink < inked.len() / 2,
            "{fitted_ink} vs {}",
            inked.len()
        );
        let blank = GreyImage {
            width: w,
            height: h,
            pixels: vec![1.0; w * h],
        };
        let none = classifier_input(&blank, (0.1, 0.5), Framing::CentredByMass);
        assert!(none.iter().all(|v| (*v + 0.2).abs() < 1e-6), "{none:?}");
    }

    #[test]
    fn input_is_28_by_28_light_on_dark_and_normalised() {
        // A 56×56 black square on white: shrunk 2x, inverted (white background).
        let mut pixels = vec![1.0; 56 * 56];
        for y in 20..36 {
            for x in 20..36 {
                pixels[y * 56 + x] = 0.0;
            }
        }
        let img = GreyImage {
            width: 56,
            height: 56,
            pixels,
        };
        let x = classifier_input(&img, (0.0, 1.0), Framing::Fitted);
        assert_eq!(x.len(), 784);
        assert_eq!(x[14 * 28 + 14], 1.0, "the figure is light after inversion");
        assert_eq!(x[0], 0.0, "the background is dark");
        // Normalisation: (v - mean) / std.
        let y = classifier_input(&img, (0.5, 0.25), Framing::Fitted);
        assert_eq!(y[0], -2.0);
        // A wide image keeps its aspect: 56×14 becomes 28×7, centred.
        let wide = GreyImage {
            width: 56,
            height: 14,
            pixels: vec![0.8; 56 * 14],
        };
        let x = classifier_input(&wide, (0.0, 1.0), Framing::Fitted);
        assert_eq!(x[0], 0.0, "padding above is background");
        assert!(
            (x[14 * 28] - 0.2).abs() < 1e-6,
            "the light image was inverted"
        );
    }
}
