//! The "your own data" examples, run as a user would run them on the data committed
//! beside them (examples/data/): each must learn, not merely run.

#[allow(dead_code)]
#[path = "../examples/own_csv.rs"]
mod own_csv;

#[allow(dead_code)]
#[path = "../examples/own_image_folder.rs"]
mod own_image_folder;

use std::path::Path;

fn data() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data"))
}

#[test]
fn the_csv_example_learns_iris() {
    let (loss, accuracy) = own_csv::train_csv(&data().join("iris.csv"), "species", 60).unwrap();
    // 30 held-out flowers; chance is a third.
    assert!(accuracy >= 0.9, "held-out accuracy {accuracy}");
    assert!(loss < 0.3, "last epoch's loss {loss}");
}

#[test]
fn the_csv_example_names_what_does_not_fit() {
    let dir = std::env::temp_dir().join(format!("kiln-own-csv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Five feature columns where the model takes four: refused before the step.
    let wide = dir.join("wide.csv");
    let rows: String = (0..60)
        .map(|i| format!("{i},1,2,3,4,{}\n", i % 3))
        .collect();
    std::fs::write(&wide, format!("a,b,c,d,e,label\n{rows}")).unwrap();
    let e = own_csv::train_csv(&wide, "label", 2)
        .err()
        .unwrap()
        .to_string();
    assert!(
        // The first batch that meets the model (a metric's probe of the evaluation
        // data, or the first step's) is the one refused.
        e.contains("Iris::loss: `x` is f32 [")
            && e.contains(", 5] but the method takes f32 [?, 4]"),
        "{e}"
    );
    let e = own_csv::train_csv(&wide, "species", 1)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no column `species`"), "{e}");
}

#[test]
fn the_image_folder_example_learns_fashion() {
    let folder = data().join("fashion-folder");
    let r = own_image_folder::train_folder(&folder.join("train"), &folder.join("test"), 8, None)
        .unwrap();
    assert_eq!(r.classes.len(), 10);
    assert_eq!(r.classes[0], "ankle-boot");
    // 60 held-out images of 10 classes; chance is 10%.
    assert!(r.accuracy >= 0.6, "held-out accuracy {}", r.accuracy);
    assert!(r.f1 >= 0.5, "held-out macro F1 {}", r.f1);
    assert!(r.loss < 1.0, "last epoch's loss {}", r.loss);
}
