//! The models of this crate written on the dynamic path: plain Rust structs of
//! `Layer`s and `Param`s with `#[derive(Module)]`, whose forward passes run over lazy
//! tensors (loops, branches and sizes decided at run time), planned and fused when a
//! value is read. Each has the `#[model]` version's parameter names and initial values,
//! and draws its dropout masks as the `#[model]` version does, so the two are held
//! equal by the tests (models/tests/dynamic_equal.rs).

use kiln::dynamic::{Layer, LazyTensor, ModuleList};
use kiln::tensor::nn::{join, LayerSpec, Mode};
use kiln::tensor::{Backend, BuilderExt, Result};
use kiln::Module;

/// The modes of a forward pass's dropout layers: the `i`-th dropout a `#[model]`
/// method applies draws with `i ^ step_seed`, and so does the `i`-th one here.
pub struct Dropouts {
    mode: Mode,
    next: u64,
}

impl Dropouts {
    /// Dropout modes for a pass in `mode` (`Mode::Train { seed: step_seed(n) }`).
    pub fn new(mode: Mode) -> Self {
        Dropouts { mode, next: 0 }
    }

    /// The mode of the next dropout layer (each call counts one).
    pub fn next_mode(&mut self) -> Mode {
        match self.mode {
            Mode::Train { seed } => {
                let m = Mode::Train {
                    seed: seed ^ self.next,
                };
                self.next += 1;
                m
            }
            Mode::Eval => Mode::Eval,
        }
    }

    /// The pass's mode (for layers other than dropout).
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

fn layer<B: Backend>(
    ty: &str,
    args: &[usize],
    dev: &B::Device,
    seed: u64,
    name: &str,
) -> Result<Layer<B>> {
    let spec = LayerSpec::from_type(ty, args).map_err(|e| kiln::Error::invalid("layer", e))?;
    Layer::new(spec, dev, seed, name)
}

/// The MNIST MLP (`crate::mlp::Mlp`) with its widths chosen at run time.
#[derive(Module)]
pub struct DynamicMlp<B: Backend> {
    fc1: Layer<B>,
    fc2: Layer<B>,
    fc3: Layer<B>,
}

impl<B: Backend> DynamicMlp<B> {
    /// Layers `inputs -> hidden -> hidden -> outputs`, initialised from `seed` as
    /// `Mlp::init` initialises the same names.
    pub fn new(
        inputs: usize,
        hidden: usize,
        outputs: usize,
        dev: &B::Device,
        seed: u64,
    ) -> Result<Self> {
        Ok(DynamicMlp {
            fc1: Layer::linear(inputs, hidden, dev, seed, "fc1")?,
            fc2: Layer::linear(hidden, hidden, dev, seed, "fc2")?,
            fc3: Layer::linear(hidden, outputs, dev, seed, "fc3")?,
        })
    }

    /// The first layer.
    pub fn fc1(&self) -> &Layer<B> {
        &self.fc1
    }

    /// Logits of a batch `[N, inputs]`.
    pub fn forward(&self, x: &LazyTensor<B>) -> Result<LazyTensor<B>> {
        let h = self.fc1.forward(x, Mode::Eval)?.relu()?;
        let h = self.fc2.forward(&h, Mode::Eval)?.relu()?;
        self.fc3.forward(&h, Mode::Eval)
    }

    /// Mean cross-entropy of a batch against labels `[N]` (i32).
    pub fn loss(&self, x: &LazyTensor<B>, y: &LazyTensor<B>) -> Result<LazyTensor<B>> {
        let logits = self.forward(x)?;
        logits.ops().cross_entropy(&logits, y, 0.0)
    }
}

/// The Fashion-MNIST CNN (`crate::lenet::LeNet`) on the dynamic path.
#[derive(Module)]
pub struct DynamicLeNet<B: Backend> {
    conv1: Layer<B>,
    bn1: Layer<B>,
    pool1: Layer<B>,
    conv2: Layer<B>,
    bn2: Layer<B>,
    pool2: Layer<B>,
    fc1: Layer<B>,
    drop: Layer<B>,
    fc2: Layer<B>,
}

impl<B: Backend> DynamicLeNet<B> {
    /// The layers, initialised as `LeNet::init` initialises the same names.
    pub fn new(dev: &B::Device, seed: u64) -> Result<Self> {
        Ok(DynamicLeNet {
            conv1: layer("Conv2d", &[1, 32, 5, 1, 2], dev, seed, "conv1")?,
            bn1: layer("BatchNorm2d", &[32], dev, seed, "bn1")?,
            pool1: layer("MaxPool2d", &[2], dev, seed, "pool1")?,
            conv2: layer("Conv2d", &[32, 64, 5], dev, seed, "conv2")?,
            bn2: layer("BatchNorm2d", &[64], dev, seed, "bn2")?,
            pool2: layer("MaxPool2d", &[2], dev, seed, "pool2")?,
            fc1: layer("Linear", &[1600, 128], dev, seed, "fc1")?,
            drop: layer("Dropout", &[25], dev, seed, "drop")?,
            fc2: layer("Linear", &[128, 10], dev, seed, "fc2")?,
        })
    }

    /// Logits of images `[N, 1, 28, 28]`.
    pub fn forward(&self, x: &LazyTensor<B>, mode: Mode) -> Result<LazyTensor<B>> {
        let mut drops = Dropouts::new(mode);
        let h = self.conv1.forward(x, mode)?;
        let h = self
            .pool1
            .forward(&self.bn1.forward(&h, mode)?.relu()?, mode)?;
        let h = self.conv2.forward(&h, mode)?;
        let h = self
            .pool2
            .forward(&self.bn2.forward(&h, mode)?.relu()?, mode)?;
        let n = h.dims()[0];
        let h = self
            .fc1
            .forward(&h.reshape(&[n, h.numel() / n.max(1)])?, mode)?
            .relu()?;
        self.fc2
            .forward(&self.drop.forward(&h, drops.next_mode())?, mode)
    }

    /// Mean cross-entropy against labels `[N]` (i32).
    pub fn loss(&self, x: &LazyTensor<B>, y: &LazyTensor<B>, mode: Mode) -> Result<LazyTensor<B>> {
        let logits = self.forward(x, mode)?;
        logits.ops().cross_entropy(&logits, y, 0.0)
    }
}

/// `crate::parts::ResidualMlp` on the dynamic path, at any width.
#[derive(Module)]
pub struct DynamicResidualMlp<B: Backend> {
    norm: Layer<B>,
    up: Layer<B>,
    down: Layer<B>,
}

impl<B: Backend> DynamicResidualMlp<B> {
    /// Width `d` with an inner width `4 d`, named under `prefix`.
    pub fn new(d: usize, dev: &B::Device, seed: u64, prefix: &str) -> Result<Self> {
        Ok(DynamicResidualMlp {
            norm: layer("LayerNorm", &[d], dev, seed, &join(prefix, "norm"))?,
            up: layer("Linear", &[d, 4 * d], dev, seed, &join(prefix, "up"))?,
            down: layer("Linear", &[4 * d, d], dev, seed, &join(prefix, "down"))?,
        })
    }

    /// `x + down(gelu(up(norm(x))))`.
    pub fn forward(&self, x: &LazyTensor<B>) -> Result<LazyTensor<B>> {
        let h = self
            .up
            .forward(&self.norm.forward(x, Mode::Eval)?, Mode::Eval)?
            .gelu()?;
        x.add(&self.down.forward(&h, Mode::Eval)?)
    }
}

/// `crate::parts::CausalSelfAttention` on the dynamic path: `heads` heads over width
/// `d`, any batch and sequence length.
#[derive(Module)]
pub struct DynamicAttention<B: Backend> {
    q: Layer<B>,
    k: Layer<B>,
    v: Layer<B>,
    proj: Layer<B>,
    #[module(skip)]
    heads: usize,
}

impl<B: Backend> DynamicAttention<B> {
    /// Width `d` in `heads` heads, named under `prefix`.
    pub fn new(d: usize, heads: usize, dev: &B::Device, seed: u64, prefix: &str) -> Result<Self> {
        if heads == 0 || !d.is_multiple_of(heads) {
            return Err(kiln::Error::invalid(
                "attention",
                format!("width {d} does not split into {heads} heads"),
            ));
        }
        let lin = |n| layer("Linear", &[d, d], dev, seed, &join(prefix, n));
        Ok(DynamicAttention {
            q: lin("q")?,
            k: lin("k")?,
            v: lin("v")?,
            proj: lin("proj")?,
            heads,
        })
    }

    /// Causal self-attention over `x: [B, T, D]`.
    pub fn forward(&self, x: &LazyTensor<B>) -> Result<LazyTensor<B>> {
        let &[b, t, d] = x.dims() else {
            return Err(kiln::Error::shape(
                "attention",
                format!(
                    "expects [B, T, D], got {}",
                    kiln::tensor::op::fmt_dims(x.dims())
                ),
            ));
        };
        let (h, dh) = (self.heads, d / self.heads);
        let split = |l: &Layer<B>| -> Result<LazyTensor<B>> {
            l.forward(x, Mode::Eval)?
                .reshape(&[b, t, h, dh])?
                .permute(&[0, 2, 1, 3])
        };
        let (q, k, v) = (split(&self.q)?, split(&self.k)?, split(&self.v)?);
        let scores = q
            .matmul(&k.transpose(2, 3)?)?
            .mul_scalar(1.0 / (dh as f64).sqrt())?;
        let weights = scores.ops().causal_mask(&scores)?.softmax(3)?;
        let y = weights
            .matmul(&v)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[b, t, d])?;
        self.proj.forward(&y, Mode::Eval)
    }
}

/// `crate::gpt::GptBlock` on the dynamic path.
#[derive(Module)]
pub struct DynamicGptBlock<B: Backend> {
    ln1: Layer<B>,
    attn: DynamicAttention<B>,
    ln2: Layer<B>,
    up: Layer<B>,
    down: Layer<B>,
    drop: Layer<B>,
}

impl<B: Backend> DynamicGptBlock<B> {
    /// Width `d` in `heads` heads, named under `prefix`.
    pub fn new(d: usize, heads: usize, dev: &B::Device, seed: u64, prefix: &str) -> Result<Self> {
        let at = |n| join(prefix, n);
        Ok(DynamicGptBlock {
            ln1: layer("LayerNorm", &[d], dev, seed, &at("ln1"))?,
            attn: DynamicAttention::new(d, heads, dev, seed, &at("attn"))?,
            ln2: layer("LayerNorm", &[d], dev, seed, &at("ln2"))?,
            up: layer("Linear", &[d, 4 * d], dev, seed, &at("up"))?,
            down: layer("Linear", &[4 * d, d], dev, seed, &at("down"))?,
            drop: layer("Dropout", &[10], dev, seed, &at("drop"))?,
        })
    }

    /// The block over `x: [B, T, D]`.
    pub fn forward(&self, x: &LazyTensor<B>, drops: &mut Dropouts) -> Result<LazyTensor<B>> {
        let m = drops.mode();
        let a = self.attn.forward(&self.ln1.forward(x, m)?)?;
        let h = x.add(&self.drop.forward(&a, drops.next_mode())?)?;
        let up = self.up.forward(&self.ln2.forward(&h, m)?, m)?.gelu()?;
        h.add(
            &self
                .drop
                .forward(&self.down.forward(&up, m)?, drops.next_mode())?,
        )
    }
}

/// `crate::gpt::Gpt` on the dynamic path: sizes chosen at run time, and any sequence
/// length up to the context, batch by batch.
#[derive(Module)]
pub struct DynamicGpt<B: Backend> {
    tok: Layer<B>,
    pos: Layer<B>,
    blocks: ModuleList<DynamicGptBlock<B>>,
    norm: Layer<B>,
    head: Layer<B>,
    drop: Layer<B>,
    #[module(skip)]
    context: usize,
}

impl<B: Backend> DynamicGpt<B> {
    /// Width `d`, `heads` heads, `layers` blocks, context `context`, initialised as the
    /// `#[model]` GPT of the same sizes is.
    pub fn new(
        d: usize,
        heads: usize,
        layers: usize,
        context: usize,
        dev: &B::Device,
        seed: u64,
    ) -> Result<Self> {
        Ok(DynamicGpt {
            tok: layer("Embedding", &[256, d], dev, seed, "tok")?,
            pos: layer("Embedding", &[context, d], dev, seed, "pos")?,
            blocks: ModuleList(
                (0..layers)
                    .map(|i| DynamicGptBlock::new(d, heads, dev, seed, &format!("blocks.{i}")))
                    .collect::<Result<_>>()?,
            ),
            norm: layer("LayerNorm", &[d], dev, seed, "norm")?,
            head: layer("Linear", &[d, 256], dev, seed, "head")?,
            drop: layer("Dropout", &[10], dev, seed, "drop")?,
            context,
        })
    }

    /// The longest sequence it takes.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Next-byte logits `[B, T, 256]` of byte ids `[B, T]` (i32).
    pub fn logits(&self, ids: &LazyTensor<B>, mode: Mode) -> Result<LazyTensor<B>> {
        let mut drops = Dropouts::new(mode);
        let at = ids.ops().positions(ids, self.context)?;
        let x = self
            .tok
            .forward(ids, mode)?
            .add(&self.pos.forward(&at, mode)?)?;
        let mut h = self.drop.forward(&x, drops.next_mode())?;
        for block in self.blocks.iter() {
            h = block.forward(&h, &mut drops)?;
        }
        self.head.forward(&self.norm.forward(&h, mode)?, mode)
    }

    /// Mean next-byte cross-entropy of `ids` against `next` (both `[B, T]`, i32).
    pub fn loss(
        &self,
        ids: &LazyTensor<B>,
        next: &LazyTensor<B>,
        mode: Mode,
    ) -> Result<LazyTensor<B>> {
        let logits = self.logits(ids, mode)?;
        let n = ids.numel();
        let flat = logits.reshape(&[n, 256])?;
        flat.ops().cross_entropy(&flat, &next.reshape(&[n])?, 0.0)
    }
}
