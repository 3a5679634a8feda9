//! A GPT, composed of `#[model]` parts with named sizes: token and position
//! embeddings, `L` pre-norm transformer blocks (causal self-attention in `H` heads and
//! a GELU MLP of width `4 * D`, each residual), a final norm and a head over the 256
//! byte values; 10% dropout on the embeddings and each residual branch while training.
//! One definition; its instances are declared where they are used (an instance expands
//! the whole model, so the library keeps none, and a rebuild after an edit of another
//! model of the zoo does not compile them): `TinyGpt = Gpt<16, 2, 2, 32>` and
//! `SmallGpt = Gpt<128, 4, 4, 128>` in models/src/gpt_instances.rs, which the binaries,
//! the examples and the tests include; W3's `Gpt<512, 8, 6, 256>` in `kiln-bench`.

use crate::parts::CausalSelfAttention;
use kiln::prelude::*;

/// One pre-norm transformer block of width `D` with `H` attention heads.
#[model]
pub struct GptBlock<const D: usize, const H: usize> {
    ln1: LayerNorm<D>,
    attn: CausalSelfAttention<D, H>,
    ln2: LayerNorm<D>,
    up: Linear<D, { 4 * D }>,
    down: Linear<{ 4 * D }, D>,
    drop: Dropout<10>,
}

#[model]
impl GptBlock {
    /// `x + attn(ln1(x))`, then the same with the MLP; each branch dropped out by 10%
    /// while training.
    pub fn forward<const B: usize, const T: usize>(&self, x: Tensor<B, T, D>) -> Tensor<B, T, D> {
        let h = x + self.drop(self.attn(self.ln1(x)));
        h + self.drop(self.down(self.up(self.ln2(h)).gelu()))
    }
}

/// A byte-level GPT: `L` blocks of width `D` with `H` heads, context up to `CTX`.
#[model]
pub struct Gpt<const D: usize, const H: usize, const L: usize, const CTX: usize> {
    tok: Embedding<256, D>,
    pos: Embedding<CTX, D>,
    blocks: [GptBlock<D, H>; L],
    norm: LayerNorm<D>,
    head: Linear<D, 256>,
    drop: Dropout<10>,
}

#[model]
impl Gpt {
    /// The next-byte logits at every position of a batch of byte windows.
    pub fn logits<const B: usize, const T: usize>(
        &self,
        ids: Tensor<B, T, i32>,
    ) -> Tensor<B, T, 256> {
        let mut h = self.drop(self.tok(ids) + self.pos.positions(ids));
        for block in &self.blocks {
            h = block(h);
        }
        self.head(self.norm(h))
    }

    /// The next-byte logits of a batch of windows of any length up to `CTX` (generation
    /// grows its context one byte at a time).
    pub fn logits_any(&self, ids: Tensor<Dyn, Dyn, i32>) -> Tensor<Dyn, Dyn, 256> {
        let mut h = self.drop(self.tok(ids) + self.pos.positions(ids));
        for block in &self.blocks {
            h = block(h);
        }
        self.head(self.norm(h))
    }

    /// Mean cross-entropy (nats per byte) of the logits against the next bytes.
    pub fn loss<const B: usize, const T: usize>(
        &self,
        ids: Tensor<B, T, i32>,
        next: Tensor<B, T, i32>,
    ) -> Tensor {
        self.logits(ids)
            .reshape::<Dyn, 256>()
            .cross_entropy(next.reshape::<Dyn>())
    }
}

/// A batch of `B` byte windows of `T` bytes.
pub type Ids<Be, const B: usize, const T: usize> = Tensor<Be, (Const<B>, Const<T>), i32>;

/// What training and generation need of a GPT, whatever its sizes: each instance of
/// [`Gpt`] implements it by its own methods.
pub trait GptModel<Be: Backend>: kiln::tensor::nn::Module<Be> + Sized {
    /// The instance's name (`SmallGpt`, `SmallGptBf16`).
    const NAME: &'static str;
    /// The configuration its checkpoints record, which `kiln-generate` builds: the
    /// name of the f32 instance of the same sizes (`SmallGpt` for `SmallGptBf16`).
    const CONFIG: &'static str;
    /// The longest context its position table holds.
    const CONTEXT: usize;
    /// Mean cross-entropy (nats per byte) of next-byte predictions.
    fn loss<const B: usize, const T: usize>(
        &self,
        ids: &Ids<Be, B, T>,
        next: &Ids<Be, B, T>,
    ) -> Result<Tensor<Be, (), f32>>;
    /// The loss and its gradients.
    fn loss_and_grad<const B: usize, const T: usize>(
        &self,
        ids: &Ids<Be, B, T>,
        next: &Ids<Be, B, T>,
    ) -> Result<(Tensor<Be, (), f32>, Self::Grads)>;
    /// Next-byte logits for windows of any length up to [`Self::CONTEXT`].
    fn logits_any(
        &self,
        ids: &Tensor<Be, (Dyn, Dyn), i32>,
    ) -> Result<Tensor<Be, (Dyn, Dyn, Const<256>), f32>>;
    /// Whether the training step draws random values (dropout masks).
    fn draws_at_random() -> bool;
}

/// The rows of the embedding table `field` returns (read from its type).
#[doc(hidden)]
pub const fn table_rows<M, Be: Backend, const V: usize, const D: usize>(
    _field: fn(&M) -> &kiln::tensor::nn::Embedding<Be, V, D>,
) -> usize {
    V
}

/// Implements [`GptModel`] for instances of [`Gpt`], here or in another crate
/// (`kiln_models::gpt_model!(W3Gpt);` after `#[model] type W3Gpt = Gpt<512, 8, 6, 256>;`);
/// `gpt_model!(SmallGptBf16 as SmallGpt)` records another instance's configuration
/// (one of the same sizes in another precision).
#[macro_export]
macro_rules! gpt_model {
    ($($name:ident $(as $config:ident)?),*) => {$(
        impl<Be: ::kiln::tensor::Backend> $crate::gpt::GptModel<Be> for $name<Be> {
            const NAME: &'static str = stringify!($name);
            const CONFIG: &'static str = $crate::__first!($(stringify!($config),)? stringify!($name));
            const CONTEXT: usize = $crate::gpt::table_rows(<$name<Be>>::__kiln_field_pos);
            fn loss<const B: usize, const T: usize>(
                &self,
                ids: &$crate::gpt::Ids<Be, B, T>,
                next: &$crate::gpt::Ids<Be, B, T>,
            ) -> ::kiln::tensor::Result<::kiln::tensor::Tensor<Be, (), f32>> {
                <$name<Be>>::loss(self, ids, next)
            }
            fn loss_and_grad<const B: usize, const T: usize>(
                &self,
                ids: &$crate::gpt::Ids<Be, B, T>,
                next: &$crate::gpt::Ids<Be, B, T>,
            ) -> ::kiln::tensor::Result<(::kiln::tensor::Tensor<Be, (), f32>, Self::Grads)> {
                <$name<Be>>::loss_and_grad(self, ids, next)
            }
            fn logits_any(
                &self,
                ids: &::kiln::tensor::Tensor<Be, (::kiln::tensor::Dyn, ::kiln::tensor::Dyn), i32>,
            ) -> ::kiln::tensor::Result<
                ::kiln::tensor::Tensor<Be, (::kiln::tensor::Dyn, ::kiln::tensor::Dyn, ::kiln::tensor::Const<256>), f32>,
            > {
                <$name<Be>>::logits_any(self, ids)
            }
            fn draws_at_random() -> bool {
                ::kiln::fusion::plan::training_draws(<$name<Be>>::fusion_plans())
            }
        }
    )*};
}

/// The first of its arguments (`gpt_model!`'s optional configuration name).
#[doc(hidden)]
#[macro_export]
macro_rules! __first {
    ($first:expr $(, $rest:expr)*) => {
        $first
    };
}

/// How [`generate`] samples: how many bytes, at which temperature, among how many of
/// the likeliest, from which seed.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Bytes to generate.
    pub bytes: usize,
    /// Temperature (> 0; lower is more conservative).
    pub temperature: f64,
    /// Sample among the `top_k` likeliest bytes (1 to 256).
    pub top_k: usize,
    /// Seed of the draws.
    pub seed: u64,
}

/// Writes `prompt` (a newline when empty) and then `sampling.bytes` bytes sampled from
/// `model` one at a time to `out`, the context growing to the model's (through the
/// planned path with a `Dyn` context), then a newline.
pub fn generate<Be: Backend, M: GptModel<Be>>(
    model: &M,
    prompt: &[u8],
    sampling: &Sampling,
    dev: &Be::Device,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    use kiln::tensor::rng;
    let mut text: Vec<u8> = if prompt.is_empty() {
        b"\n".to_vec()
    } else {
        prompt.to_vec()
    };
    out.write_all(&text)?;
    let key = rng::stream_key(sampling.seed, 0);
    for i in 0..sampling.bytes {
        let context = &text[text.len().saturating_sub(M::CONTEXT)..];
        let ids: Vec<i32> = context.iter().map(|&b| b as i32).collect();
        let ids = Tensor::<Be, (Dyn, Dyn), i32>::from_vec(ids, &[1, context.len()], dev)?;
        let logits = model.logits_any(&ids)?.raw().to_vec::<f32>()?;
        let last = &logits[(context.len() - 1) * 256..];
        let u = rng::unit_f32(rng::bits(key, i as u32)) as f64;
        let byte = sample(last, sampling.temperature, sampling.top_k, u);
        text.push(byte);
        out.write_all(&[byte])?;
    }
    writeln!(out)?;
    Ok(())
}

/// Draws a byte from `logits` at `temperature` among the `top_k` most likely, with the
/// uniform draw `u` in [0, 1).
#[inline]
fn sample(logits: &[f32], temperature: f64, top_k: usize, u: f64) -> u8 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(top_k);
    let top = logits[order[0]] as f64;
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i] as f64 - top) / temperature).exp())
        .collect();
    let mut x = u * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if x < *w {
            return i as u8;
        }
        x -= w;
    }
    order[order.len() - 1] as u8
}
