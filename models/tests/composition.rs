//! `#[model]`s composed of other `#[model]`s: a model as a field (from another module,
//! named by a path or brought in by `use`) and arrays of them iterated with `for`;
//! parameters named as PyTorch names them, gradients through the whole tree checked
//! against finite differences, fused and op-by-op paths equal, checkpoints round-trip.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;

mod common;
use common::check_finite_differences;
use kiln::tensor::nn::Module;
use kiln::tensor::RawTensor;

mod blocks {
    use kiln::prelude::*;

    /// A pre-norm residual MLP block.
    #[model]
    pub struct Block {
        norm: LayerNorm<32>,
        up: Linear<32, 64>,
        down: Linear<64, 32>,
    }

    #[model]
    impl Block {
        pub fn forward<const B: usize>(&self, x: Tensor<B, 32>) -> Tensor<B, 32> {
            x + self.mlp(x)
        }

        pub fn mlp<const N: usize>(&self, x: Tensor<N, 32>) -> Tensor<N, 32> {
            self.down(self.up(self.norm(x)).gelu())
        }
    }
}

use blocks::Block;

/// Blocks in an array, one more by path, and layers around them.
#[model]
pub struct Deep {
    embed: Linear<16, 32>,
    blocks: [Block; 3],
    extra: blocks::Block,
    head: Linear<32, 4>,
}

#[model]
impl Deep {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 4> {
        let mut h = self.embed(x);
        for block in &self.blocks {
            h = block(h);
        }
        h = self.extra.mlp(h) + self.blocks[1].forward(h);
        self.head(h)
    }

    pub fn loss<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// A model of this crate holding a part from another crate (`kiln_models::parts`).
#[model]
pub struct WithPart {
    embed: Linear<16, 32>,
    part: kiln_models::parts::ResidualMlp,
    head: Linear<32, 4>,
}

#[model]
impl WithPart {
    pub fn loss<const B: usize>(&self, x: Tensor<B, 16>, y: Tensor<B, i32>) -> Tensor {
        self.head(self.part(self.embed(x))).cross_entropy(y)
    }
}

fn batch() -> (Tensor<Cpu, Rank2<8, 16>>, Tensor<Cpu, (Const<8>,), i32>) {
    let x = Tensor::<Cpu, Rank2<8, 16>>::normal(0.0, 1.0, 11, &CpuDevice).unwrap();
    let y = Tensor::from_vec((0..8).map(|i| i % 4).collect(), &[8], &CpuDevice).unwrap();
    (x, y)
}

fn values(t: &RawTensor<Cpu>) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn parameters_are_named_as_pytorch_names_them() {
    let model = Deep::<Cpu>::init(&CpuDevice, 1).unwrap();
    let mut names = Vec::new();
    model.visit_params("", &mut |s| names.push(s.name.to_string()));
    assert_eq!(names.len(), 2 + 4 * 6 + 2);
    for want in [
        "embed.weight",
        "blocks.0.norm.weight",
        "blocks.2.up.bias",
        "extra.down.weight",
        "head.bias",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // Each nested parameter is initialised from its own name.
    let mut ups = Vec::new();
    model.visit_params("", &mut |s| {
        if s.name.ends_with("up.weight") {
            ups.push(values(s.value));
        }
    });
    assert_eq!(ups.len(), 4);
    assert_ne!(ups[0], ups[1]);
}

#[test]
fn a_nested_model_is_a_model_of_its_own() {
    let block = Block::<Cpu>::init(&CpuDevice, 3).unwrap();
    let x = Tensor::<Cpu, Rank2<5, 32>>::normal(0.0, 1.0, 4, &CpuDevice).unwrap();
    let y = block.forward(&x).unwrap();
    assert_eq!(y.raw().dims().as_slice(), &[5, 32]);
}

#[test]
fn fused_and_op_by_op_agree_through_the_tree() {
    let model = Deep::<Cpu>::init(&CpuDevice, 1).unwrap();
    let (x, y) = batch();
    let run = |fused: bool| {
        model.set_fused(fused);
        let out = values(model.forward(&x).unwrap().raw());
        let (loss, grads) = model.loss_and_grad(&x, &y).unwrap();
        let mut all = out;
        all.extend(values(loss.raw()));
        all.extend(values(grads.blocks[2].up.weight.raw()));
        all.extend(values(grads.extra.norm.bias.raw()));
        all.extend(values(grads.embed.weight.raw()));
        all
    };
    let (fused, unfused) = (run(true), run(false));
    assert_eq!(fused.len(), unfused.len());
    for (a, b) in fused.iter().zip(&unfused) {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
            "{a} fused, {b} op by op"
        );
    }
}

#[test]
fn gradients_through_nested_models_match_finite_differences() {
    let mut model = Deep::<Cpu>::init(&CpuDevice, 5).unwrap();
    let (x, y) = batch();
    let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
    let at = [
        ("embed.weight", 3),
        ("blocks.0.norm.weight", 7),
        ("blocks.1.up.weight", 100),
        ("blocks.2.down.bias", 5),
        ("extra.up.bias", 9),
        ("extra.norm.bias", 2),
        ("head.weight", 17),
    ];
    check_finite_differences(&mut model, &grads, &at, 1e-4, |m| {
        m.loss(&x, &y).unwrap().raw().to_vec::<f32>().unwrap()[0]
    });
}

#[test]
fn a_composed_model_trains_and_round_trips_a_checkpoint() {
    use kiln::train::optim::{Optimizer, Sgd, SgdConfig};
    let mut model = Deep::<Cpu>::init(&CpuDevice, 2).unwrap();
    let (x, y) = batch();
    let mut opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.1,
        ..SgdConfig::default()
    })
    .unwrap();
    let first = values(model.loss(&x, &y).unwrap().raw())[0];
    for _ in 0..30 {
        let (_, grads) = model.loss_and_grad(&x, &y).unwrap();
        opt.step(&mut model, &grads).unwrap();
    }
    let last = values(model.loss(&x, &y).unwrap().raw())[0];
    assert!(last < first / 4.0, "the loss went from {first} to {last}");

    let dir = std::env::temp_dir().join(format!("kiln-composition-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("deep.safetensors");
    kiln::train::checkpoint::save(&model, &path).unwrap();
    let mut again = Deep::<Cpu>::init(&CpuDevice, 9).unwrap();
    kiln::train::checkpoint::load(&mut again, &path).unwrap();
    assert_eq!(
        values(again.forward(&x).unwrap().raw()),
        values(model.forward(&x).unwrap().raw())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_part_from_another_crate_composes() {
    let model = WithPart::<Cpu>::init(&CpuDevice, 4).unwrap();
    let mut names = Vec::new();
    model.visit_params("", &mut |s| names.push(s.name.to_string()));
    assert!(names.iter().any(|n| n == "part.up.weight"), "{names:?}");
    let (x, y) = batch();
    let (loss, grads) = model.loss_and_grad(&x, &y).unwrap();
    model.set_fused(false);
    let (again, grads_again) = model.loss_and_grad(&x, &y).unwrap();
    assert!((values(loss.raw())[0] - values(again.raw())[0]).abs() < 1e-5);
    let (a, b) = (
        values(grads.part.down.bias.raw()),
        values(grads_again.part.down.bias.raw()),
    );
    assert!(a.iter().any(|v| *v != 0.0));
    for (a, b) in a.iter().zip(&b) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{a} fused, {b} op by op"
        );
    }
}
