//! Image files a user gives the classifiers: PNG (any colour type and bit depth) and
//! PGM (`P2` text and `P5` binary), read into grey intensities in [0, 1], and turned
//! into what the zoo's MNIST-style models take: 28×28, a light figure on a dark
//! background, normalised as in training.
//!
//! Readers are bounded: the file is read through a limit of [`MAX_FILE_BYTES`] (a
//! larger file is refused from its size, a stream such as `/dev/zero` once it passes
//! the limit), its first bytes decide the format before more is read, a PNG is decoded
//! from the file as it streams with the decoder's memory limit, and a file's declared
//! width and height are checked (with overflow checked arithmetic) against
//! [`MAX_PIXELS`] and against the bytes it actually holds before any pixel buffer is
//! allocated; an unreadable or malformed file is an error naming it.

use kiln::tensor::{Error, Result};
use std::io::{BufReader, Read};
use std::path::Path;

/// The most pixels an image may declare (16 megapixels: a 4096×4096 scan, a phone's
/// photo); the classifiers see 28×28 of them.
pub const MAX_PIXELS: usize = 1 << 24;

/// The most bytes an image file may hold (256 MiB: a 16-megapixel PGM written as text).
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The side of the square the classifiers take.
pub const SIDE: usize = 28;

/// A grey image: `width × height` intensities in [0, 1], row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct GreyImage {
    /// Columns.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Intensities in [0, 1] (0 black, 1 white), row-major.
    pub pixels: Vec<f32>,
}

/// Reads the PNG or PGM file at `path` (told apart by their first bytes, not the
/// name) as a grey image; colour is turned to luminance, and transparency composited
/// over white.
pub fn read_image(path: &Path) -> Result<GreyImage> {
    let bad = |why: String| Error::Format(format!("cannot read image {}: {why}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let size = file.metadata().map_err(|e| bad(e.to_string()))?;
    if size.is_file() && size.len() > MAX_FILE_BYTES {
        return Err(bad(format!(
            "it holds {} bytes, more than the {MAX_FILE_BYTES} read here",
            size.len()
        )));
    }
    let mut reader = BufReader::new(file.take(MAX_FILE_BYTES + 1));
    let mut magic = Vec::with_capacity(8);
    (&mut reader)
        .take(8)
        .read_to_end(&mut magic)
        .map_err(|e| bad(e.to_string()))?;
    let past_limit = || {
        bad(format!(
            "it is longer than the {MAX_FILE_BYTES} bytes read here"
        ))
    };
    if magic.starts_with(b"\x89PNG\r\n\x1a\n") {
        let image = read_png(std::io::Cursor::new(magic).chain(&mut reader)).map_err(bad)?;
        // The decoder stops at the image's end; what is left must fit the limit too.
        if reader.get_ref().limit() == 0 {
            return Err(past_limit());
        }
        Ok(image)
    } else if magic.starts_with(b"P5") || magic.starts_with(b"P2") {
        let mut bytes = magic;
        reader
            .read_to_end(&mut bytes)
            .map_err(|e| bad(e.to_string()))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(past_limit());
        }
        read_pgm(&bytes).map_err(bad)
    } else {
        Err(bad(
            "it is neither a PNG nor a PGM file (the formats read here)".into(),
        ))
    }
}

/// Checks declared dims against [`MAX_PIXELS`], returning the pixel count.
fn pixel_count(width: usize, height: usize) -> std::result::Result<usize, String> {
    if width == 0 || height == 0 {
        return Err(format!("it declares an empty image ({width}×{height})"));
    }
    width
        .checked_mul(height)
        .filter(|&n| n <= MAX_PIXELS)
        .ok_or_else(|| {
            format!("it declares {width}×{height} pixels, more than the {MAX_PIXELS} read here")
        })
}

fn read_png(bytes: impl Read) -> std::result::Result<GreyImage, String> {
    let mut decoder = png::Decoder::new_with_limits(
        BufReader::new(bytes),
        png::Limits {
            bytes: MAX_PIXELS * 8,
        },
    );
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(|e| e.to_string())?;
    let (width, height) = {
        let info = reader.info();
        (info.width as usize, info.height as usize)
    };
    pixel_count(width, height)?;
    let mut buf = vec![0u8; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buf).map_err(|e| e.to_string())?;
    let data = &buf[..frame.buffer_size()];
    let channels = match frame.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => return Err("an indexed PNG was not expanded".into()),
    };
    if frame.bit_depth != png::BitDepth::Eight || data.len() != width * height * channels {
        return Err(format!(
            "the decoded frame has {} bytes at depth {:?}, not {width}×{height}×{channels}",
            data.len(),
            frame.bit_depth
        ));
    }
    let pixels = data
        .chunks_exact(channels)
        .map(|p| {
            let v = |i: usize| p[i] as f32 / 255.0;
            let (grey, alpha) = match channels {
                1 => (v(0), 1.0),
                2 => (v(0), v(1)),
                3 => (0.299 * v(0) + 0.587 * v(1) + 0.114 * v(2), 1.0),
                _ => (0.299 * v(0) + 0.587 * v(1) + 0.114 * v(2), v(3)),
            };
            grey * alpha + (1.0 - alpha)
        })
        .collect();
    Ok(GreyImage {
        width,
        height,
        pixels,
    })
}

/// PGM: `P5` (binary) or `P2` (text), a header of width, height and the largest
/// value (at most 65535; two big-endian bytes a sample above 255), `#` comments.
fn read_pgm(bytes: &[u8]) -> std::result::Result<GreyImage, String> {
    let binary = bytes.starts_with(b"P5");
    let mut at = 2;
    let mut field = |what: &str| -> std::result::Result<usize, String> {
        loop {
            while at < bytes.len() && bytes[at].is_ascii_whitespace() {
                at += 1;
            }
            if at < bytes.len() && bytes[at] == b'#' {
                while at < bytes.len() && bytes[at] != b'\n' {
                    at += 1;
                }
                continue;
            }
            break;
        }
        let start = at;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
        }
        std::str::from_utf8(&bytes[start..at])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("its header has no valid {what}"))
    };
    let width = field("width")?;
    let height = field("height")?;
    let max = field("largest value")?;
    if max == 0 || max > 65535 {
        return Err(format!("its largest value {max} is not in 1..=65535"));
    }
    let n = pixel_count(width, height)?;
    let max_f = max as f32;
    let pixels: Vec<f32> = if binary {
        // One whitespace byte ends the header.
        let data = bytes.get(at + 1..).unwrap_or_default();
        let width_of = if max > 255 { 2 } else { 1 };
        if data.len() != n * width_of {
            return Err(format!(
                "it declares {width}×{height} samples of {width_of} byte(s) but holds {} bytes of them",
                data.len()
            ));
        }
        data.chunks_exact(width_of)
            .map(|c| {
                let v = if width_of == 2 {
                    u16::from_be_bytes([c[0], c[1]]) as usize
                } else {
                    c[0] as usize
                };
                v.min(max) as f32 / max_f
            })
            .collect()
    } else {
        let mut text = String::new();
        bytes[at..]
            .take(bytes.len() as u64)
            .read_to_string(&mut text)
            .map_err(|_| "its samples are not text".to_string())?;
        let values: Vec<usize> = text
            .split_ascii_whitespace()
            .map(|s| s.parse().map_err(|_| format!("`{s}` is not a sample")))
            .collect::<std::result::Result<_, _>>()?;
        if values.len() != n {
            return Err(format!(
                "it declares {width}×{height} samples but holds {}",
                values.len()
            ));
        }
        values
            .into_iter()
            .map(|v| v.min(max) as f32 / max_f)
            .collect()
    };
    Ok(GreyImage {
        width,
        height,
        pixels,
    })
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

    fn pgm(header: &str, data: &[u8]) -> std::result::Result<GreyImage, String> {
        read_pgm(&[header.as_bytes(), data].concat())
    }

    #[test]
    fn pgm_reads_both_forms_and_refuses_what_does_not_add_up() {
        let img = pgm("P5 2 1 255\n", &[0, 255]).unwrap();
        assert_eq!(img.pixels, vec![0.0, 1.0]);
        let img = pgm("P2\n# a comment\n2 2\n4\n0 1 2 4\n", &[]).unwrap();
        assert_eq!(img.pixels, vec![0.0, 0.25, 0.5, 1.0]);
        let img = pgm("P5 1 1 65535\n", &[0x80, 0x00]).unwrap();
        assert!((img.pixels[0] - 0.5).abs() < 1e-4);
        for (header, data, want) in [
            ("P5 2 2 255\n", &[0u8, 1][..], "holds 2 bytes"),
            ("P5 99999999 99999999 255\n", &[][..], "more than the"),
            ("P5 0 3 255\n", &[][..], "empty image"),
            ("P5 2 x 255\n", &[][..], "no valid height"),
            ("P5 1 1 70000\n", &[0, 0][..], "not in 1..=65535"),
            ("P2 2 1 9\n1 zz", &[][..], "`zz` is not a sample"),
        ] {
            let e = pgm(header, data).unwrap_err();
            assert!(e.contains(want), "{header:?}: {e}");
        }
    }

    /// A scratch file `name` for one test.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    /// Files that would cost more than their worth are refused before the memory is
    /// spent: a stream of zeros from its first bytes, a file over the size limit from its
    /// size, a PNG declaring too many pixels from its header.
    #[test]
    fn unbounded_and_oversized_files_are_refused_before_reading_them() {
        #[cfg(unix)]
        {
            let start = std::time::Instant::now();
            let e = read_image(Path::new("/dev/zero")).unwrap_err().to_string();
            assert!(e.contains("neither a PNG nor a PGM"), "{e}");
            assert!(
                start.elapsed().as_secs() < 2,
                "read /dev/zero for {:?}",
                start.elapsed()
            );
        }
        let big = scratch("big.pgm");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap(); // sparse: no disk spent
        drop(file);
        let e = read_image(&big).unwrap_err().to_string();
        assert!(
            e.contains(&format!("more than the {MAX_FILE_BYTES} read here")),
            "{e}"
        );
        std::fs::remove_file(&big).unwrap();
        // A header declaring 5000×5000 pixels, then one empty IDAT chunk (the decoder
        // reads up to the first) and no pixel data.
        let huge = scratch("huge.png");
        let mut header = Vec::new();
        png::Encoder::new(&mut header, 5000, 5000)
            .write_header()
            .unwrap()
            .finish()
            .ok();
        let iend = header.len() - 12;
        header.truncate(iend);
        header.extend(0u32.to_be_bytes());
        header.extend(b"IDAT");
        header.extend(crc32fast::hash(b"IDAT").to_be_bytes());
        std::fs::write(&huge, &header).unwrap();
        let e = read_image(&huge).unwrap_err().to_string();
        assert!(
            e.contains("declares 5000×5000 pixels, more than the"),
            "{e}"
        );
        std::fs::remove_file(&huge).unwrap();
    }

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
