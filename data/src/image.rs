//! Image files: PNG (any colour type and bit depth), JPEG (grey and RGB) and PGM (`P2`
//! text and `P5` binary), read into intensities in [0, 1] with the channels the file
//! has; [`Image::grey`] and [`Image::rgb`] give one or three channels, and
//! [`resize_bilinear`] resamples planes to another size.
//!
//! Readers are bounded: the file is read through a limit of [`MAX_FILE_BYTES`] (a
//! larger file is refused from its size, a stream such as `/dev/zero` once it passes
//! the limit), its first bytes decide the format before more is read, a PNG is decoded
//! from the file as it streams with the decoder's memory limit, and a file's declared
//! width and height are checked (with overflow checked arithmetic) against
//! [`MAX_PIXELS`] and against the bytes it actually holds before any pixel buffer is
//! allocated; an unreadable or malformed file is an error naming it.

use kiln_tensor::{Error, Result};
use std::io::{BufReader, Read};
use std::path::Path;

/// The most pixels an image may declare (16 megapixels: a 4096×4096 scan, a phone's
/// photo); the classifiers see 28×28 of them.
pub const MAX_PIXELS: usize = 1 << 24;

/// The most bytes an image file may hold (256 MiB: a 16-megapixel PGM written as text).
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// An image as its file holds it: `width × height` pixels of `channels` intensities
/// in [0, 1] (1 grey, 2 grey and alpha, 3 RGB, 4 RGBA), row-major, channels last.
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    /// Columns.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Intensities per pixel: 1, 2, 3 or 4.
    pub channels: usize,
    /// Intensities in [0, 1], row-major, a pixel's channels together.
    pub pixels: Vec<f32>,
}

impl Image {
    /// Grey intensities: colour turned to luminance (ITU-R 601 weights), transparency
    /// composited over white.
    pub fn grey(&self) -> GreyImage {
        let c = self.channels;
        let pixels = self
            .pixels
            .chunks_exact(c)
            .map(|p| {
                let (grey, alpha) = match c {
                    1 => (p[0], 1.0),
                    2 => (p[0], p[1]),
                    3 => (0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2], 1.0),
                    _ => (0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2], p[3]),
                };
                grey * alpha + (1.0 - alpha)
            })
            .collect();
        GreyImage {
            width: self.width,
            height: self.height,
            pixels,
        }
    }

    /// Red, green and blue planes (`[3, height, width]`, as PyTorch's `ToTensor`
    /// gives): grey repeated, alpha dropped (as PIL's `convert("RGB")` does).
    pub fn rgb(&self) -> Vec<f32> {
        let n = self.width * self.height;
        let mut planes = vec![0.0; 3 * n];
        for (i, p) in self.pixels.chunks_exact(self.channels).enumerate() {
            let rgb = match self.channels {
                1 | 2 => [p[0]; 3],
                _ => [p[0], p[1], p[2]],
            };
            for (k, v) in rgb.into_iter().enumerate() {
                planes[k * n + i] = v;
            }
        }
        planes
    }
}

/// `channels` planes of `height × width` resampled to `new_height × new_width`,
/// bilinearly with pixel centres aligned (PyTorch's `interpolate(mode="bilinear",
/// align_corners=False)` without antialiasing).
pub fn resize_bilinear(
    planes: &[f32],
    channels: usize,
    (height, width): (usize, usize),
    (new_height, new_width): (usize, usize),
) -> Vec<f32> {
    assert_eq!(
        planes.len(),
        channels * height * width,
        "planes of the stated size"
    );
    if (height, width) == (new_height, new_width) {
        return planes.to_vec();
    }
    // For each output coordinate: the two source coordinates and the weight of the
    // second, clamped at the borders.
    let taps = |from: usize, to: usize| -> Vec<(usize, usize, f32)> {
        let scale = from as f32 / to as f32;
        (0..to)
            .map(|o| {
                let x = ((o as f32 + 0.5) * scale - 0.5).max(0.0);
                let lo = (x as usize).min(from - 1);
                let hi = (lo + 1).min(from - 1);
                (lo, hi, x - lo as f32)
            })
            .collect()
    };
    let rows = taps(height, new_height);
    let cols = taps(width, new_width);
    let mut out = Vec::with_capacity(channels * new_height * new_width);
    for plane in planes.chunks_exact(height * width) {
        for &(r0, r1, wr) in &rows {
            for &(c0, c1, wc) in &cols {
                let at = |r: usize, c: usize| plane[r * width + c];
                let top = at(r0, c0) * (1.0 - wc) + at(r0, c1) * wc;
                let bottom = at(r1, c0) * (1.0 - wc) + at(r1, c1) * wc;
                out.push(top * (1.0 - wr) + bottom * wr);
            }
        }
    }
    out
}

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

/// Reads the PNG, JPEG or PGM file at `path` (told apart by their first bytes, not the
/// name) with the channels it holds.
pub fn read_image(path: &Path) -> Result<Image> {
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
        let grey = read_pgm(&bytes).map_err(bad)?;
        Ok(Image {
            width: grey.width,
            height: grey.height,
            channels: 1,
            pixels: grey.pixels,
        })
    } else if magic.starts_with(b"\xff\xd8\xff") {
        let image = read_jpeg(std::io::Cursor::new(magic).chain(&mut reader)).map_err(bad)?;
        if reader.get_ref().limit() == 0 {
            return Err(past_limit());
        }
        Ok(image)
    } else {
        Err(bad(
            "it is neither a PNG, a JPEG nor a PGM file (the formats read here)".into(),
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

fn read_png(bytes: impl Read) -> std::result::Result<Image, String> {
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
    Ok(Image {
        width,
        height,
        channels,
        pixels: data.iter().map(|&b| b as f32 / 255.0).collect(),
    })
}

/// A baseline or progressive JPEG, grey or RGB (CMYK is refused), decoded within
/// [`MAX_PIXELS`].
fn read_jpeg(bytes: impl Read) -> std::result::Result<Image, String> {
    let mut decoder = jpeg_decoder::Decoder::new(BufReader::new(bytes));
    decoder.set_max_decoding_buffer_size(MAX_PIXELS * 4);
    decoder.read_info().map_err(|e| e.to_string())?;
    let info = decoder
        .info()
        .ok_or_else(|| "its header has no frame".to_string())?;
    let (width, height) = (info.width as usize, info.height as usize);
    pixel_count(width, height)?;
    let (channels, two_bytes) = match info.pixel_format {
        jpeg_decoder::PixelFormat::L8 => (1, false),
        jpeg_decoder::PixelFormat::L16 => (1, true),
        jpeg_decoder::PixelFormat::RGB24 => (3, false),
        jpeg_decoder::PixelFormat::CMYK32 => return Err("it is a CMYK JPEG; save it as RGB".into()),
    };
    let data = decoder.decode().map_err(|e| e.to_string())?;
    let samples = width * height * channels;
    let pixels: Vec<f32> = if two_bytes {
        data.chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]) as f32 / 65535.0)
            .collect()
    } else {
        data.iter().map(|&b| b as f32 / 255.0).collect()
    };
    if pixels.len() != samples {
        return Err(format!(
            "it decodes to {} samples, not {width}×{height}×{channels}",
            pixels.len()
        ));
    }
    Ok(Image {
        width,
        height,
        channels,
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
            assert!(e.contains("neither a PNG, a JPEG nor a PGM"), "{e}");
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
}
