use kiln::prelude::*;

// Causal self-attention of width `D` in `H` heads of `D / H`.
#[model]
pub struct Attention<const D: usize, const H: usize> {
    q: Linear<D, D>,
    k: Linear<D, D>,
    v: Linear<D, D>,
}

#[model]
impl Attention {
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, T, D> {
        let q = self.q(x).reshape::<B, T, H, { D / H }>().permute::<0, 2, 1, 3>();
        let k = self.k(x).reshape::<B, T, H, { D / H }>().permute::<0, 2, 1, 3>();
        let v = self.v(x).reshape::<B, T, H, { D / H }>().permute::<0, 2, 1, 3>();
        let weights = (q.matmul(k.t()) / ((D / H) as f32).sqrt()).causal_mask().softmax();
        weights.matmul(v).permute::<0, 2, 1, 3>().reshape::<B, T, D>()
    }
}

// A library's definitions are checked where they are written, before any instance:
// a mistake that holds whatever the sizes is reported at the definition. The block's
// `down` takes `2 * D` features where `up` gives `4 * D`.
#[model]
pub struct Block<const D: usize, const H: usize> {
    norm: LayerNorm<D>,
    attn: Attention<D, H>,
    up: Linear<D, { 4 * D }>,
    down: Linear<{ 2 * D }, D>,
}

#[model]
impl Block {
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, T, D> {
        let h = x + self.attn(self.norm(x));
        h + self.down(self.up(h).gelu())
    }
}

// A model holding a row of parts (`L` of them) is checked with two. Its mistake, the
// head fed `D` features where it takes `D / 2`, is reported once.
#[model]
pub struct Stack<const D: usize, const H: usize, const L: usize> {
    blocks: [Attention<D, H>; L],
    head: Linear<{ D / 2 }, 10>,
}

#[model]
impl Stack {
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, T, 10> {
        let mut h = x;
        for block in &self.blocks {
            h = block(h);
        }
        self.head(h)
    }
}

// Definitions that hold for any sizes report nothing: halves and quarters, heads, and a
// row of parts whose count is a size.
#[model]
pub struct Halves<const D: usize, const H: usize, const L: usize> {
    attn: Attention<D, H>,
    down: Linear<D, { D / 2 }>,
    quarter: Linear<{ D / 2 }, { D / 4 }>,
    rows: [Linear<{ D / 4 }, { D / 4 }>; L],
}

#[model]
impl Halves {
    pub fn forward<const B: usize, const T: usize>(
        &self,
        x: Tensor<B, T, D>,
    ) -> Tensor<B, T, { D / 4 }> {
        let mut h = self.quarter(self.down(self.attn(x)));
        for row in &self.rows {
            h = row(h).relu();
        }
        h
    }
}

// A definition whose only size is a count reports nothing.
#[model]
pub struct Deep<const L: usize> {
    layers: [Linear<8, 8>; L],
}

#[model]
impl Deep {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 8>) -> Tensor<B, 8> {
        let mut h = x;
        for layer in &self.layers {
            h = layer(h).relu();
        }
        h
    }
}

// Stand-in sizes are large enough for a wide window: a 9×9 convolution over an image
// of side `S` reports nothing.
#[model]
pub struct Wide<const S: usize> {
    conv: Conv2d<1, 4, 9>,
}

#[model]
impl Wide {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 1, S, S>) -> Tensor<B, 4> {
        self.conv(x).relu().mean::<3>().mean::<2>()
    }
}

// A model holding the broken block adds no error of its own, nor does its instance or
// a caller of that instance.
#[model]
pub struct Tower<const D: usize> {
    block: Block<D, 2>,
}

#[model]
impl Tower {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 4, D>) -> Tensor<B, 4, D> {
        self.block(x)
    }
}

#[model]
type Tower8 = Tower<8>;

fn main() {
    use kiln::cpu::{Cpu, CpuDevice};
    let tower = Tower8::<Cpu>::init(&CpuDevice, 0).unwrap();
    let x = Tensor::<Cpu, Rank3<2, 4, 8>>::zeros(&CpuDevice).unwrap();
    let _ = tower.forward(&x);
}
