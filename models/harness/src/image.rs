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

/// The 28×28 input a zoo classifier takes from `image`, normalised with `norm`
/// (mean, std) as in training: the image is scaled to fit 28×28 (area averaging,
/// aspect kept, centred on the background), and inverted when its background (the
/// border's mean) is light, since MNIST and Fashion-MNIST show light figures on black.
pub fn classifier_input(image: &GreyImage, norm: (f32, f32)) -> Vec<f32> {
    let (w, h) = (image.width, image.height);
    let border: Vec<f32> = (0..w)
        .flat_map(|x| [image.pixels[x], image.pixels[(h - 1) * w + x]])
        .chain((0..h).flat_map(|y| [image.pixels[y * w], image.pixels[y * w + w - 1]]))
        .collect();
    let light = border.iter().sum::<f32>() / border.len() as f32 > 0.5;
    let background = if light {
        0.0
    } else {
        border.iter().sum::<f32>() / border.len() as f32
    };
    let at = |x: usize, y: usize| {
        let v = image.pixels[y * w + x];
        if light {
            1.0 - v
        } else {
            v
        }
    };
    // Scale so the longer side spans 28 pixels; each output pixel averages the source
    // area it covers (exact for shrinking, nearest-like for growing).
    let scale = w.max(h) as f32 / SIDE as f32;
    let (out_w, out_h) = (
        ((w as f32 / scale).round() as usize).clamp(1, SIDE),
        ((h as f32 / scale).round() as usize).clamp(1, SIDE),
    );
    let (x0, y0) = ((SIDE - out_w) / 2, (SIDE - out_h) / 2);
    let mut out = vec![background; SIDE * SIDE];
    for oy in 0..out_h {
        for ox in 0..out_w {
            let sx = (ox as f32 * scale) as usize;
            let sy = (oy as f32 * scale) as usize;
            let ex = (((ox + 1) as f32 * scale).ceil() as usize).clamp(sx + 1, w);
            let ey = (((oy + 1) as f32 * scale).ceil() as usize).clamp(sy + 1, h);
            let mut sum = 0.0;
            for y in sy..ey {
                for x in sx..ex {
                    sum += at(x, y);
                }
            }
            out[(y0 + oy) * SIDE + x0 + ox] = sum / ((ex - sx) * (ey - sy)) as f32;
        }
    }
    let (mean, std) = norm;
    out.iter().map(|v| (v - mean) / std).collect()
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

    /// PNG's chunk checksum (CRC-32, reflected, polynomial 0xEDB88320).
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
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
        header.extend(crc32(b"IDAT").to_be_bytes());
        std::fs::write(&huge, &header).unwrap();
        let e = read_image(&huge).unwrap_err().to_string();
        assert!(
            e.contains("declares 5000×5000 pixels, more than the"),
            "{e}"
        );
        std::fs::remove_file(&huge).unwrap();
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
        let x = classifier_input(&img, (0.0, 1.0));
        assert_eq!(x.len(), 784);
        assert_eq!(x[14 * 28 + 14], 1.0, "the figure is light after inversion");
        assert_eq!(x[0], 0.0, "the background is dark");
        // Normalisation: (v - mean) / std.
        let y = classifier_input(&img, (0.5, 0.25));
        assert_eq!(y[0], -2.0);
        // A wide image keeps its aspect: 56×14 becomes 28×7, centred.
        let wide = GreyImage {
            width: 56,
            height: 14,
            pixels: vec![0.8; 56 * 14],
        };
        let x = classifier_input(&wide, (0.0, 1.0));
        assert_eq!(x[0], 0.0, "padding above is background");
        assert!(
            (x[14 * 28] - 0.2).abs() < 1e-6,
            "the light image was inverted"
        );
    }
}
