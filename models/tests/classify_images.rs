//! Image files in, classes out: the readers give exactly the data set's inputs for the
//! data set's own images (PNG, binary and text PGM; an enlarged, inverted RGB PNG to
//! within rounding), and `kiln-classify` prints, for each file, the class and
//! probabilities the model gives those inputs; a file that is not an image is one
//! error naming it.

#[path = "support/output.rs"]
mod output;

use kiln::cpu::{Cpu, CpuDevice};
use kiln::train::checkpoint;
use kiln_models::classify::{predict, Classifier, Prediction};
use kiln_models::cli::ImageData;
use kiln_models::data::{Split, SplitName};
use kiln_models::image::{classifier_input, read_image};
use kiln_models::{lenet::LeNet, mlp::Mlp};
use std::path::{Path, PathBuf};

const CLASSIFY: &str = env!("CARGO_BIN_EXE_kiln-classify");
const TRAIN: &str = env!("CARGO_BIN_EXE_kiln-train");

/// The fixture images of `prefix` (`mnist`, `fashion`): path, test index, label.
fn fixtures(prefix: &str) -> Vec<(PathBuf, usize, i32)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images");
    ["grey", "binary", "text", "big_inverted"]
        .iter()
        .enumerate()
        .map(|(index, kind)| {
            let name = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n.starts_with(&format!("{prefix}_{kind}_")))
                .unwrap_or_else(|| panic!("no {prefix} {kind} fixture"));
            let label = name.rsplit('_').next().unwrap().split('.').next().unwrap();
            (dir.join(&name), index, label.parse().unwrap())
        })
        .collect()
}

fn test_split(data: ImageData) -> Split {
    let dir = kiln_models::data::data_dir().join(data.folder());
    Split::load(&dir, SplitName::Test, data.norm()).unwrap()
}

#[test]
fn image_files_give_the_data_sets_inputs() {
    for (prefix, data) in [("mnist", ImageData::Mnist), ("fashion", ImageData::Fashion)] {
        let test = test_split(data);
        for (path, index, label) in fixtures(prefix) {
            assert_eq!(test.labels[index], label, "{}", path.display());
            let want = &test.images[index * 784..(index + 1) * 784];
            let got = classifier_input(&read_image(&path).unwrap(), data.norm(), data.framing());
            if path.to_string_lossy().contains("big_inverted") {
                let worst = got
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(worst < 1e-5, "{}: off by {worst}", path.display());
            } else {
                assert_eq!(got, want, "{}", path.display());
            }
        }
    }
}

/// Trains a small checkpoint of `model` on `data` with `kiln-train`.
fn trained(model: &str, data: &str, out: &Path) {
    let (code, _, err) = output::run(
        TRAIN,
        &[
            "--model",
            model,
            "--dataset",
            data,
            "--limit",
            "1024",
            "--epochs",
            "1",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
}

/// What `kiln-classify` prints for `path` must be what the model says of the data
/// set's input for it.
fn check_printed<M: Classifier<Cpu>>(model: &M, data: ImageData, stdout: &str, prefix: &str) {
    let test = test_split(data);
    for (path, index, _) in fixtures(prefix) {
        let input = test.images[index * 784..(index + 1) * 784].to_vec();
        let p: Prediction = predict(model, input, &CpuDevice).unwrap();
        let line = format!("{}: {}", path.display(), p.describe(data.classes()));
        if path.to_string_lossy().contains("big_inverted") {
            // Within rounding of the input: the same class.
            let class = data.classes()[p.class];
            assert!(
                stdout.contains(&format!("{}: {class} (", path.display())),
                "{line}\n{stdout}"
            );
        } else {
            assert!(stdout.contains(&line), "{line}\nnot in\n{stdout}");
        }
    }
}

#[test]
fn kiln_classify_prints_each_files_class_and_probabilities() {
    let dir = std::env::temp_dir().join(format!("kiln-classify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (model, data, prefix) in [
        ("mlp", ImageData::Mnist, "mnist"),
        ("cnn", ImageData::Fashion, "fashion"),
    ] {
        let ckpt = dir.join(format!("{model}.safetensors"));
        trained(model, &format!("{data:?}").to_lowercase(), &ckpt);
        let files: Vec<String> = fixtures(prefix)
            .into_iter()
            .map(|(p, ..)| p.to_string_lossy().into_owned())
            .collect();
        let mut args = vec![
            "--model",
            model,
            "--dataset",
            if prefix == "mnist" {
                "mnist"
            } else {
                "fashion"
            },
            "--checkpoint",
            ckpt.to_str().unwrap(),
        ];
        args.extend(files.iter().map(String::as_str));
        let (code, stdout, err) = output::run(CLASSIFY, &args);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(stdout.lines().count(), 4, "{stdout}");
        if model == "mlp" {
            let mut m = Mlp::<Cpu>::init(&CpuDevice, 0).unwrap();
            checkpoint::load(&mut m, &ckpt).unwrap();
            check_printed(&m, data, &stdout, prefix);
        } else {
            let mut m = LeNet::<Cpu>::init(&CpuDevice, 0).unwrap();
            checkpoint::load(&mut m, &ckpt).unwrap();
            check_printed(&m, data, &stdout, prefix);
        }
    }

    // A file that is not an image, and one that is not there: each named, exit 1,
    // the good file still classified.
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images");
    let good = images.join("mnist_grey_7.png");
    let bad = images.join("not_an_image.png");
    let ckpt = dir.join("mlp.safetensors");
    let (code, stdout, err) = output::run(
        CLASSIFY,
        &[
            "--checkpoint",
            ckpt.to_str().unwrap(),
            good.to_str().unwrap(),
            bad.to_str().unwrap(),
            "/kiln-nowhere.png",
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        err.contains("cannot read image")
            && err.contains("not_an_image.png: it is neither a PNG, a JPEG nor a PGM"),
        "{err}"
    );
    assert!(err.contains("cannot read image /kiln-nowhere.png"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
