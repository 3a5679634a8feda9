//! Models with named sizes: one definition (`struct Stack<const D: usize, ..>`, size
//! arithmetic in its types and bodies), instances at several sizes, in this crate and
//! of another crate's definitions, held by other models, trained, their gradients
//! checked against finite differences.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::nn::Module;

mod common;
use common::check_finite_differences;

/// A residual MLP of width `D` and hidden width `F * D`, made here.
#[model]
pub struct Mlp<const D: usize, const F: usize> {
    norm: LayerNorm<D>,
    up: Linear<D, { F * D }>,
    down: Linear<{ F * D }, D>,
}

#[model]
impl<const D: usize, const F: usize> Mlp<D, F> {
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, T, D> {
        x + self.down(self.up(self.norm(x)).gelu())
    }
}

/// `L` blocks of attention (another crate's definition, instantiated with this
/// model's sizes) and MLP, then a head over `C` classes from the mean over positions.
#[model]
pub struct Stack<const D: usize, const H: usize, const L: usize, const C: usize> {
    attn: [kiln_models::parts::CausalSelfAttention<D, H>; L],
    mlp: [Mlp<D, 2>; L],
    head: Linear<D, C>,
}

#[model]
impl Stack {
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, C> {
        let mut h = x * (1.0 / (D as f32).sqrt());
        h = h + self.attn[0](h);
        h = self.mlp[0](h);
        h = h + self.attn[L - 1](h);
        h = self.mlp[L - 1](h);
        self.head(h.mean::<1>())
    }

    pub fn loss<const B: usize, const T: usize>(
        &self,
        x: Tensor<B, T, D>,
        y: Tensor<B, i32>,
    ) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// Two instances of one definition.
#[model]
pub type SmallStack = Stack<16, 2, 2, 3>;

#[model]
pub type WideStack = Stack<32, 4, 3, 5>;

/// An instance of another crate's definition, declared here.
#[model]
pub type Attention24 = kiln_models::parts::CausalSelfAttention<24, 3>;

/// A model without sizes holding an instance.
#[model]
pub struct Holder {
    stack: SmallStack,
    extra: Linear<3, 2>,
}

#[model]
impl Holder {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 4, 16>) -> Tensor<B, 2> {
        self.extra(self.stack(x))
    }

    pub fn loss<const B: usize>(&self, x: Tensor<B, 4, 16>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

fn names<M: Module<Cpu>>(m: &M) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    m.visit_params("", &mut |s| {
        out.push((s.name.to_string(), s.value.dims().to_vec()))
    });
    out
}

#[test]
fn instances_take_their_sizes_from_one_definition() {
    let small = SmallStack::<Cpu>::init(&CpuDevice, 1).unwrap();
    let wide = WideStack::<Cpu>::init(&CpuDevice, 1).unwrap();
    let small_names = names(&small);
    let wide_names = names(&wide);
    // PyTorch's names through arrays and nesting; sizes from each instance.
    assert!(
        small_names.contains(&("attn.1.q.weight".into(), vec![16, 16])),
        "{small_names:?}"
    );
    assert!(
        small_names.contains(&("mlp.1.up.weight".into(), vec![32, 16])),
        "{small_names:?}"
    );
    assert!(
        wide_names.contains(&("attn.2.proj.weight".into(), vec![32, 32])),
        "{wide_names:?}"
    );
    assert!(
        wide_names.contains(&("mlp.0.down.weight".into(), vec![32, 64])),
        "{wide_names:?}"
    );
    assert!(
        wide_names.contains(&("head.weight".into(), vec![5, 32])),
        "{wide_names:?}"
    );
    // Parameter counts from the sizes: per block 4·D² + 4·D attention, LayerNorm 2·D,
    // MLP 2·(2D·D) + 2D + D; the head D·C + C.
    let count = |d: usize, l: usize, c: usize| {
        l * (4 * d * d + 4 * d + 2 * d + 4 * d * d + 3 * d) + d * c + c
    };
    assert_eq!(small.num_params(), count(16, 2, 3));
    assert_eq!(wide.num_params(), count(32, 3, 5));
    assert!(
        SmallStack::<Cpu>::summary().contains("CausalSelfAttention<16, 2>"),
        "{}",
        SmallStack::<Cpu>::summary()
    );

    let x = Tensor::<Cpu, Rank3<2, 4, 32>>::normal(0.0, 1.0, 3, &CpuDevice).unwrap();
    let y = wide.forward(&x).unwrap();
    assert_eq!(y.raw().dims().as_slice(), &[2, 5]);
}

#[test]
fn an_instance_of_another_crates_definition_works_here() {
    let attn = Attention24::<Cpu>::init(&CpuDevice, 4).unwrap();
    assert_eq!(attn.num_params(), 4 * (24 * 24 + 24));
    let x = Tensor::<Cpu, Rank3<2, 5, 24>>::normal(0.0, 1.0, 5, &CpuDevice).unwrap();
    let fused = attn.forward(&x).unwrap().raw().to_vec::<f32>().unwrap();
    attn.set_fused(false);
    let op_by_op = attn.forward(&x).unwrap().raw().to_vec::<f32>().unwrap();
    for (a, b) in fused.iter().zip(&op_by_op) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn a_holder_of_an_instance_trains_and_its_gradients_match_finite_differences() {
    let mut model = Holder::<Cpu>::init(&CpuDevice, 7).unwrap();
    let x = Tensor::<Cpu, Rank3<6, 4, 16>>::normal(0.0, 1.0, 8, &CpuDevice).unwrap();
    let y = Tensor::<Cpu, (Const<6>,), i32>::from_vec(vec![0, 1, 1, 0, 1, 0], &[6], &CpuDevice)
        .unwrap();
    let loss = |m: &Holder<Cpu>| m.loss(&x, &y).unwrap().raw().to_vec::<f32>().unwrap()[0];
    let (_, grads) = model
        .loss_and_grad(&x, &y)
        .unwrap_or_else(|e| panic!("{e}"));
    check_finite_differences(
        &mut model,
        &grads,
        &[
            ("stack.attn.0.q.weight", 5),
            ("stack.mlp.1.up.weight", 40),
            ("stack.head.weight", 7),
            ("extra.weight", 1),
        ],
        1e-6,
        loss,
    );
}

/// A language model whose output head is its token embedding (`attend`): one
/// parameter used twice.
#[model]
pub struct TiedLm<const V: usize, const D: usize> {
    tok: Embedding<V, D>,
    norm: LayerNorm<D>,
}

#[model]
impl TiedLm {
    pub fn loss<const B: usize, const T: usize>(
        &self,
        ids: Tensor<B, T, i32>,
        next: Tensor<B, T, i32>,
    ) -> Tensor {
        self.tok
            .attend(self.norm(self.tok(ids)))
            .reshape::<Dyn, V>()
            .cross_entropy(next.reshape::<Dyn>())
    }
}

#[model]
pub type Tied = TiedLm<12, 8>;

#[test]
fn a_tied_head_shares_the_embedding_and_its_gradient_sums_both_uses() {
    let mut model = Tied::<Cpu>::init(&CpuDevice, 3).unwrap();
    let mut count = 0;
    model.visit_params("", &mut |_| count += 1);
    assert_eq!(count, 3, "one table, the norm's weight and bias");
    let ids = Tensor::<Cpu, (Const<2>, Const<5>), i32>::from_vec(
        vec![1, 4, 7, 2, 11, 0, 3, 3, 9, 5],
        &[2, 5],
        &CpuDevice,
    )
    .unwrap();
    let next = Tensor::<Cpu, (Const<2>, Const<5>), i32>::from_vec(
        vec![4, 7, 2, 11, 6, 3, 3, 9, 5, 10],
        &[2, 5],
        &CpuDevice,
    )
    .unwrap();
    let (_, grads) = model.loss_and_grad(&ids, &next).unwrap();
    // Row 4 is both looked up and scored; row 6 (a target, never an input) only scored.
    check_finite_differences(
        &mut model,
        &grads,
        &[
            ("tok.weight", 4 * 8 + 2),
            ("tok.weight", 6 * 8 + 5),
            ("norm.weight", 3),
        ],
        1e-5,
        |m| m.loss(&ids, &next).unwrap().raw().to_vec::<f32>().unwrap()[0],
    );
}
