//! The ready datasets: CSV files, text windows and image folders, on good files and
//! on every kind of bad one (each an error naming the file and the row or image).

use kiln_data::image::{read_image, resize_bilinear};
use kiln_data::{
    Channels, Column, CsvConfig, CsvDataset, Dataset, Field, ImageFolder, ImageFolderConfig,
    LabelKind, TextWindows, Values,
};
use std::path::PathBuf;

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-data-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &PathBuf, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.clone()
}

fn features(f: &Field) -> Vec<f32> {
    match &f.values {
        Values::F32(v) => v.clone(),
        Values::I32(_) => panic!("f32 expected"),
    }
}

#[test]
fn csv_rows_become_features_and_classes() {
    let dir = scratch("csv");
    let path = write(
        &dir.join("flowers.csv"),
        "sepal,petal,species,width\n5.1, 1.4,setosa,0.2\n\n7.0,4.7,versicolor,1.4\r\n6.3,\"6.0\",virginica,2.5\n4.9,1.5,setosa,0.1\n",
    );
    let data = CsvDataset::open(&path, &CsvConfig::classes_in("species")).unwrap();
    assert_eq!(data.len(), 4);
    assert_eq!(data.classes(), ["setosa", "versicolor", "virginica"]);
    assert_eq!(data.num_classes(), 3);
    assert_eq!(data.feature_names(), ["`sepal`", "`petal`", "`width`"]);
    let e = data.get(2).unwrap();
    assert_eq!(e.input.dims, [3]);
    assert_eq!(features(&e.input), [6.3, 6.0, 2.5]);
    assert_eq!(e.target, Field::class(2));
    assert_eq!(data.get(3).unwrap().target, Field::class(0));

    // Whole-number labels are used as they are; a chosen subset of features; no header.
    let path = write(&dir.join("digits.csv"), "0.5;3;7\n0.25;1;9\n");
    let config = CsvConfig {
        label: Column::Index(1),
        kind: LabelKind::Class,
        features: Some(vec![Column::Index(2), Column::Index(0)]),
        delimiter: b';',
        header: false,
    };
    let data = CsvDataset::open(&path, &config).unwrap();
    assert_eq!(data.num_classes(), 4);
    assert_eq!(features(&data.get(1).unwrap().input), [9.0, 0.25]);
    assert_eq!(data.get(0).unwrap().target, Field::class(3));

    // Regression targets.
    let path = write(&dir.join("prices.csv"), "rooms,price\n3,250.5\n4,310\n");
    let config = CsvConfig {
        kind: LabelKind::Value,
        ..CsvConfig::classes_in("price")
    };
    let data = CsvDataset::open(&path, &config).unwrap();
    assert_eq!(data.get(0).unwrap().target, Field::features(vec![250.5]));
    assert_eq!(data.num_classes(), 0);
}

#[test]
fn bad_csv_files_name_the_file_line_and_column() {
    let dir = scratch("bad-csv");
    let cases = [
        (
            "a,b,label\n1,2,0\n3,,1\n",
            "line 3, column `b`: `` is empty (a missing value)",
        ),
        (
            "a,b,label\n1,2,0\n3,x4,1\n",
            "line 3, column `b`: `x4` is not a number",
        ),
        (
            "a,b,label\n1,2,0\n3,inf,1\n",
            "`inf` is not a finite number",
        ),
        (
            "a,b,label\n1,2,0\n3,4\n",
            "line 3 has 2 columns where the first line has 3",
        ),
        (
            "a,b,kind\n1,2,0\n",
            "it has no column `label` (its columns: a, b, kind)",
        ),
        ("a,b,label\n", "it has no rows of data"),
        ("", "it has no rows of data"),
        ("label\n1\n", "no feature columns besides the label"),
        ("a,b,label\n1,2,\n3,4,cat\n", "line 2 has an empty label"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = write(&dir.join(format!("bad{i}.csv")), text);
        let e = CsvDataset::open(&path, &CsvConfig::classes_in("label"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(e.contains(&format!("bad{i}.csv")), "names the file: {e}");
    }
    let path = write(&dir.join("values.csv"), "a,label\n1,2\n3,high\n");
    let config = CsvConfig {
        kind: LabelKind::Value,
        ..CsvConfig::classes_in("label")
    };
    let e = CsvDataset::open(&path, &config).unwrap_err().to_string();
    assert!(
        e.contains("line 3, label column `label`: `high` is not a number"),
        "{e}"
    );
    let e = CsvDataset::open(dir.join("missing.csv"), &CsvConfig::classes_in("label"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.csv: cannot open it"), "{e}");
    let no_header = CsvConfig {
        header: false,
        ..CsvConfig::classes_in("label")
    };
    let path = write(&dir.join("plain.csv"), "1,2\n");
    let e = CsvDataset::open(&path, &no_header).unwrap_err().to_string();
    assert!(
        e.contains("by name but the file is read without a header"),
        "{e}"
    );
    let long = format!(
        "a,label\n{},1\n",
        "1".repeat(kiln_data::csv::MAX_ROW_BYTES + 10)
    );
    let path = write(&dir.join("long.csv"), &long);
    let e = CsvDataset::open(&path, &CsvConfig::classes_in("label"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2 is longer than"), "{e}");
}

#[test]
fn text_windows_predict_the_next_token() {
    let data = TextWindows::new((0..10).collect(), 10, 4, 3).unwrap();
    // Windows start at 0, 3 (6 would need tokens up to 10).
    assert_eq!(data.len(), 2);
    let e = data.get(1).unwrap();
    assert_eq!(e.input, Field::tokens(vec![3, 4, 5, 6]));
    assert_eq!(e.target, Field::tokens(vec![4, 5, 6, 7]));
    let dir = scratch("text");
    let path = write(&dir.join("t.txt"), "hello");
    let bytes = TextWindows::bytes_of(&path, 2, 1).unwrap();
    assert_eq!(bytes.len(), 3);
    assert_eq!(
        bytes.get(0).unwrap().target,
        Field::tokens(vec![b'e' as i32, b'l' as i32])
    );
    for (tokens, vocab, context, stride, want) in [
        (
            vec![0, 1, 12, 3],
            10,
            2,
            1,
            "token 2 is 12, outside the vocabulary of 10",
        ),
        (vec![0, 1, -1, 3], 10, 2, 1, "token 2 is -1"),
        (
            vec![0, 1, 2],
            10,
            3,
            1,
            "3 tokens are too few for a window of 3",
        ),
        (vec![0, 1, 2], 10, 0, 1, "must be at least 1"),
        (vec![0, 1, 2], 10, 1, 0, "must be at least 1"),
    ] {
        let e = TextWindows::new(tokens, vocab, context, stride)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    let big = dir.join("big.txt");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(kiln_data::text::MAX_TEXT_BYTES + 1).unwrap(); // sparse: no disk spent
    drop(file);
    let e = TextWindows::bytes_of(&big, 2, 1).unwrap_err().to_string();
    assert!(e.contains("more than the 1073741824 read here"), "{e}");
    std::fs::remove_file(&big).unwrap();
    let e = TextWindows::bytes_of(dir.join("none.txt"), 2, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("none.txt: cannot read it"), "{e}");
}

/// Writes an 8-bit PNG of `channels` (1 grey, 3 RGB, 4 RGBA).
fn png(path: &PathBuf, width: u32, height: u32, channels: usize, data: &[u8]) {
    let file = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(file, width, height);
    enc.set_color(match channels {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    });
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(data).unwrap();
}

#[test]
fn jpeg_files_decode_as_pillow_decodes_them() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    // Pillow 12's decode of the same files (scripts in the commit that added them).
    let rgb: [[u8; 3]; 6] = [
        [0, 9, 219],
        [23, 13, 206],
        [63, 12, 175],
        [103, 13, 145],
        [144, 14, 120],
        [165, 18, 109],
    ];
    let img = read_image(&fixtures.join("gradient.jpg")).unwrap();
    assert_eq!((img.width, img.height, img.channels), (6, 4, 3));
    for (x, want) in rgb.iter().enumerate() {
        for (c, &w) in want.iter().enumerate() {
            let got = img.pixels[x * 3 + c] * 255.0;
            assert!(
                (got - w as f32).abs() <= 3.0,
                "pixel {x} channel {c}: {got} against {w}"
            );
        }
    }
    let grey = read_image(&fixtures.join("grey.jpg")).unwrap();
    assert_eq!((grey.width, grey.height, grey.channels), (5, 3, 1));
    let want = [
        0u8, 50, 99, 150, 199, 10, 61, 110, 161, 210, 19, 70, 119, 170, 219,
    ];
    for (got, want) in grey.pixels.iter().zip(want) {
        assert!(
            (got * 255.0 - want as f32).abs() <= 3.0,
            "{} against {want}",
            got * 255.0
        );
    }
    // A truncated JPEG is an error naming it.
    let dir = scratch("jpeg");
    let bytes = std::fs::read(fixtures.join("gradient.jpg")).unwrap();
    let cut = dir.join("cut.jpg");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let e = read_image(&cut).unwrap_err().to_string();
    assert!(e.contains("cut.jpg"), "{e}");
}

#[test]
fn bilinear_resizing_matches_pytorch() {
    let planes: Vec<f32> = (0..12).map(|v| v as f32 / 11.0).collect();
    // torch.nn.functional.interpolate(x, size, mode="bilinear", align_corners=False).
    let down = [
        0.106_060_61,
        0.227_272_75,
        0.348_484_87,
        0.651_515_2,
        0.772_727_3,
        0.893_939_4,
    ];
    let got = resize_bilinear(&planes, 1, (3, 4), (2, 3));
    for (g, w) in got.iter().zip(down) {
        assert!((g - w).abs() < 1e-6, "{got:?}");
    }
    let up = resize_bilinear(&planes, 1, (3, 4), (5, 7));
    assert_eq!(up.len(), 35);
    for (i, w) in [
        (0, 0.0),
        (1, 0.032467537),
        (8, 0.17792208),
        (17, 0.5),
        (34, 1.0),
    ] {
        assert!((up[i] - w).abs() < 1e-6, "{i}: {} against {w}", up[i]);
    }
}

#[test]
fn an_image_folder_is_classes_of_sized_normalised_images() {
    let root = scratch("folder");
    for class in ["cat", "dog"] {
        std::fs::create_dir_all(root.join(class)).unwrap();
    }
    std::fs::create_dir_all(root.join(".cache")).unwrap();
    png(
        &root.join("cat/a.png"),
        2,
        2,
        3,
        &[255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255],
    );
    png(&root.join("cat/b.PNG"), 4, 4, 1, &[128; 16]);
    std::fs::write(root.join("cat/notes.txt"), "not an image").unwrap();
    std::fs::write(root.join("dog/c.pgm"), b"P5 2 2 255\n\x00\x40\x80\xff").unwrap();
    png(
        &root.join("dog/d.png"),
        2,
        2,
        4,
        &[0, 0, 0, 0, 0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255],
    );

    let rgb = ImageFolder::open(
        &root,
        ImageFolderConfig {
            mean: vec![0.5; 3],
            std: vec![0.5; 3],
            ..ImageFolderConfig::new(2, 2, Channels::Rgb)
        },
    )
    .unwrap();
    assert_eq!(rgb.classes(), ["cat", "dog"]);
    assert_eq!(rgb.len(), 4);
    let a = rgb.get(0).unwrap();
    assert_eq!(a.input.dims, [3, 2, 2]);
    assert_eq!(a.target, Field::class(0));
    // Red plane of (red, green, blue, white), normalised to [-1, 1].
    assert_eq!(features(&a.input)[..4], [1.0, -1.0, -1.0, 1.0]);
    assert_eq!(rgb.get(2).unwrap().target, Field::class(1));
    // Grey: the 4×4 grey square resized to 2×2 keeps its value; transparency over
    // white.
    let grey = ImageFolder::open(&root, ImageFolderConfig::new(2, 2, Channels::Grey)).unwrap();
    let b = features(&grey.get(1).unwrap().input);
    assert!(b.iter().all(|v| (v - 128.0 / 255.0).abs() < 1e-6), "{b:?}");
    assert_eq!(features(&grey.get(3).unwrap().input)[0], 1.0);
}

#[test]
fn bad_image_folders_and_files_are_named() {
    let root = scratch("bad-folder");
    let open = |config| {
        ImageFolder::open(&root, config)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let e = open(ImageFolderConfig::new(2, 2, Channels::Grey));
    assert!(e.contains("holds no class folders"), "{e}");
    std::fs::create_dir_all(root.join("empty")).unwrap();
    let e = open(ImageFolderConfig::new(2, 2, Channels::Grey));
    assert!(e.contains("class folder `empty` holds no image"), "{e}");
    std::fs::remove_dir(root.join("empty")).unwrap();
    std::fs::create_dir_all(root.join("x")).unwrap();
    std::fs::write(root.join("x/broken.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();
    let data = ImageFolder::open(&root, ImageFolderConfig::new(2, 2, Channels::Grey)).unwrap();
    let e = data.get(0).unwrap_err().to_string();
    assert!(e.contains("broken.png"), "{e}");
    for (config, want) in [
        (
            ImageFolderConfig::new(0, 2, Channels::Grey),
            "each side at least 1",
        ),
        (
            ImageFolderConfig {
                std: vec![0.0],
                ..ImageFolderConfig::new(2, 2, Channels::Grey)
            },
            "a std of 0",
        ),
        (
            ImageFolderConfig {
                mean: vec![0.0],
                ..ImageFolderConfig::new(2, 2, Channels::Rgb)
            },
            "3 channel(s) need 3 means and stds, got 1 and 3",
        ),
    ] {
        let e = open(config);
        assert!(e.contains(want), "{e}");
    }
    let e = ImageFolder::open(
        root.join("nowhere"),
        ImageFolderConfig::new(2, 2, Channels::Grey),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("nowhere: cannot list it"), "{e}");
}
