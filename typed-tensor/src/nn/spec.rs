//! Layer specifications: what each built-in layer is, once. A spec lists the layer's
//! parameters and buffers (PyTorch's names and layouts), checks its input, and builds
//! its forward pass from primitives over any `Builder` — so the runtime layers and the
//! `#[model]` macro (which inlines layers into its graph at build time) share one
//! definition.

use crate::builder::{Builder, BuilderExt, Conv2dOptions};
use crate::error::Result;
use crate::guard::Guard;
use crate::op::{fmt_dims, SymDim};
use crate::precision::{Precision, INT8_SCALE_SUFFIX};
use crate::DType;

/// Whether a forward pass trains (dropout active, batch statistics) or evaluates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Training, with the seed of this step's random draws.
    Train {
        /// Seed for dropout masks.
        seed: u64,
    },
    /// Evaluation: deterministic.
    Eval,
}

/// How a parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Uniform on ±bound.
    Uniform(f64),
    /// Normal with this standard deviation.
    Normal(f64),
    /// A constant.
    Constant(f64),
}

/// One tensor a layer owns.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The field name, also the last part of its checkpoint name (`weight`, `bias`).
    pub name: &'static str,
    /// Its dims.
    pub dims: Vec<usize>,
    /// How it starts.
    pub init: Init,
    /// Its dtype (f32 but for int8 weights and their scales' rows).
    pub dtype: DType,
}

/// The scales of an int8 weight: the last of a layer's tensors under the int8 policy
/// ([`LayerSpec::params_in`]).
fn int8_scale<'v, V>(params: &[&'v V]) -> Result<&'v V> {
    match params {
        [_, .., scale] => Ok(*scale),
        _ => Err(crate::Error::invalid(
            "int8 layer",
            "an int8 weight comes with its scales, and none were given",
        )),
    }
}

/// The field of a layer's int8 weight scales.
const WEIGHT_SCALE: &str = "weight_scale";

/// A built-in layer with its sizes.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerSpec {
    /// `y = x Wᵀ + b` over the last axis.
    Linear {
        /// Input features.
        inputs: usize,
        /// Output features.
        outputs: usize,
    },
    /// 2-d convolution over `[N, C, H, W]`.
    Conv2d {
        /// Input channels.
        inputs: usize,
        /// Output channels.
        outputs: usize,
        /// Square kernel size.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Zero padding on each side.
        padding: usize,
        /// Channel groups.
        groups: usize,
    },
    /// Max pooling over square windows.
    MaxPool2d {
        /// Window size.
        kernel: usize,
        /// Step between windows.
        stride: usize,
    },
    /// Average pooling over square windows.
    AvgPool2d {
        /// Window size.
        kernel: usize,
        /// Step between windows.
        stride: usize,
    },
    /// Batch normalisation over the channels of `[N, C, H, W]`.
    BatchNorm2d {
        /// Channels.
        channels: usize,
    },
    /// Layer normalisation over the last axis.
    LayerNorm {
        /// Size of the last axis.
        features: usize,
    },
    /// A lookup table of `vocab` rows of `features`.
    Embedding {
        /// Rows.
        vocab: usize,
        /// Row width.
        features: usize,
    },
    /// Zeroes elements with probability `percent`/100 in training.
    Dropout {
        /// Drop probability in percent (an integer so it can be a const generic).
        percent: usize,
    },
    /// `[N, ...] -> [N, product]`.
    Flatten,
}

/// The most elements one parameter may hold (2^40: far past any memory, and products
/// of its dims still fit a `usize`).
pub const MAX_PARAM_ELEMENTS: usize = 1 << 40;

/// Batch-norm's ε and momentum (PyTorch's defaults).
pub const BATCH_NORM_EPS: f64 = 1e-5;
/// Batch-norm's running-statistics momentum.
pub const BATCH_NORM_MOMENTUM: f64 = 0.1;
/// Layer-norm's ε.
pub const LAYER_NORM_EPS: f64 = 1e-5;

/// What a forward pass produced: the output and, in training, new values of buffers
/// (batch-norm's running statistics).
pub struct LayerOut<V> {
    /// The output.
    pub y: V,
    /// `(buffer name, new value)` pairs to store after the step.
    pub updates: Vec<(&'static str, V)>,
}

impl LayerSpec {
    /// The spec of a layer type from its name and const arguments, as written in a
    /// model: `Linear<784, 128>`, `Conv2d<1, 32, 5>` (stride, padding, groups follow
    /// optionally), `MaxPool2d<2>` (stride defaults to the kernel), `Dropout<10>`.
    pub fn from_type(name: &str, args: &[usize]) -> std::result::Result<Self, String> {
        let want = |lo: usize, hi: usize, form: &str| -> std::result::Result<(), String> {
            if args.len() < lo || args.len() > hi {
                Err(format!(
                    "`{name}` takes {form}, got {} argument(s)",
                    args.len()
                ))
            } else {
                Ok(())
            }
        };
        let spec = match name {
            "Linear" => {
                want(2, 2, "<INPUTS, OUTPUTS>")?;
                LayerSpec::Linear {
                    inputs: args[0],
                    outputs: args[1],
                }
            }
            "Conv2d" => {
                want(3, 6, "<IN, OUT, KERNEL, [STRIDE, PADDING, GROUPS]>")?;
                LayerSpec::Conv2d {
                    inputs: args[0],
                    outputs: args[1],
                    kernel: args[2],
                    stride: args.get(3).copied().unwrap_or(1),
                    padding: args.get(4).copied().unwrap_or(0),
                    groups: args.get(5).copied().unwrap_or(1),
                }
            }
            "MaxPool2d" | "AvgPool2d" => {
                want(1, 2, "<KERNEL, [STRIDE]>")?;
                let (kernel, stride) = (args[0], args.get(1).copied().unwrap_or(args[0]));
                if name == "MaxPool2d" {
                    LayerSpec::MaxPool2d { kernel, stride }
                } else {
                    LayerSpec::AvgPool2d { kernel, stride }
                }
            }
            "BatchNorm2d" => {
                want(1, 1, "<CHANNELS>")?;
                LayerSpec::BatchNorm2d { channels: args[0] }
            }
            "LayerNorm" => {
                want(1, 1, "<FEATURES>")?;
                LayerSpec::LayerNorm { features: args[0] }
            }
            "Embedding" => {
                want(2, 2, "<VOCAB, FEATURES>")?;
                LayerSpec::Embedding {
                    vocab: args[0],
                    features: args[1],
                }
            }
            "Dropout" => {
                want(1, 1, "<PERCENT>")?;
                if args[0] >= 100 {
                    return Err(format!(
                        "`Dropout<{}>` drops {}% of elements; it must be below 100",
                        args[0], args[0]
                    ));
                }
                LayerSpec::Dropout { percent: args[0] }
            }
            "Flatten" => {
                want(0, 0, "no arguments")?;
                LayerSpec::Flatten
            }
            _ => return Err(format!("`{name}` is not a built-in layer")),
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Reads a layer type as `Display` writes it: `Linear<784, 128>`, `Flatten`.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let (name, args) = match s.split_once('<') {
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('>')
                    .ok_or_else(|| format!("`{s}` is not a layer type"))?;
                let args = inner
                    .split(',')
                    .map(|a| a.trim().parse::<usize>())
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|_| format!("`{s}` is not a layer type"))?;
                (name, args)
            }
            None => (s, vec![]),
        };
        Self::from_type(name, &args)
    }

    /// The names of the built-in layer types.
    pub const NAMES: &'static [&'static str] = &[
        "Linear",
        "Conv2d",
        "MaxPool2d",
        "AvgPool2d",
        "BatchNorm2d",
        "LayerNorm",
        "Embedding",
        "Dropout",
        "Flatten",
    ];

    fn validate(&self) -> std::result::Result<(), String> {
        let zero = match self {
            LayerSpec::Linear { inputs, outputs } => *inputs == 0 || *outputs == 0,
            LayerSpec::Conv2d {
                inputs,
                outputs,
                kernel,
                stride,
                groups,
                ..
            } => {
                if *groups == 0 || inputs % groups != 0 || outputs % groups != 0 {
                    return Err(format!("{self}: {groups} groups must divide {inputs} input and {outputs} output channels"));
                }
                *kernel == 0 || *stride == 0
            }
            LayerSpec::MaxPool2d { kernel, stride } | LayerSpec::AvgPool2d { kernel, stride } => {
                *kernel == 0 || *stride == 0
            }
            LayerSpec::BatchNorm2d { channels } => *channels == 0,
            LayerSpec::LayerNorm { features } => *features == 0,
            LayerSpec::Embedding { vocab, features } => *vocab == 0 || *features == 0,
            LayerSpec::Dropout { .. } | LayerSpec::Flatten => false,
        };
        if zero {
            return Err(format!("{self}: sizes must be at least 1"));
        }
        for p in self.params().iter().chain(&self.buffers()) {
            let count = p.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if count.is_none_or(|n| n > MAX_PARAM_ELEMENTS) {
                return Err(format!(
                    "{self}: its {} {} would hold more than 2^40 elements",
                    p.name,
                    fmt_dims(&p.dims)
                ));
            }
        }
        Ok(())
    }

    /// The trainable parameters, in PyTorch's order and layout.
    pub fn params(&self) -> Vec<ParamSpec> {
        let p = |name, dims: Vec<usize>, init| ParamSpec {
            name,
            dims,
            init,
            dtype: DType::F32,
        };
        match *self {
            LayerSpec::Linear { inputs, outputs } => {
                let bound = 1.0 / (inputs as f64).sqrt();
                vec![
                    p("weight", vec![outputs, inputs], Init::Uniform(bound)),
                    p("bias", vec![outputs], Init::Uniform(bound)),
                ]
            }
            LayerSpec::Conv2d {
                inputs,
                outputs,
                kernel,
                groups,
                ..
            } => {
                let fan_in = inputs / groups * kernel * kernel;
                let bound = 1.0 / (fan_in as f64).sqrt();
                vec![
                    p(
                        "weight",
                        vec![outputs, inputs / groups, kernel, kernel],
                        Init::Uniform(bound),
                    ),
                    p("bias", vec![outputs], Init::Uniform(bound)),
                ]
            }
            LayerSpec::BatchNorm2d { channels } => vec![
                p("weight", vec![channels], Init::Constant(1.0)),
                p("bias", vec![channels], Init::Constant(0.0)),
            ],
            LayerSpec::LayerNorm { features } => vec![
                p("weight", vec![features], Init::Constant(1.0)),
                p("bias", vec![features], Init::Constant(0.0)),
            ],
            LayerSpec::Embedding { vocab, features } => {
                vec![p("weight", vec![vocab, features], Init::Normal(1.0))]
            }
            _ => vec![],
        }
    }

    /// The tensors the layer holds under `precision`, in [`LayerSpec::forward`]'s
    /// order: its parameters, each weight the policy [quantizes](Precision::quantizes)
    /// as i8, then those weights' scales (`weight_scale`, f32, one per row).
    pub fn params_in(&self, precision: Precision) -> Vec<ParamSpec> {
        let mut params = self.params();
        let mut scales = Vec::new();
        for p in &mut params {
            if precision.quantizes(p.name, &p.dims, p.dtype) {
                p.dtype = DType::I8;
                // A layer's tensors are named by their fields, without dots: the
                // rule's only match among them is `weight`.
                debug_assert_eq!(format!("weight{INT8_SCALE_SUFFIX}"), WEIGHT_SCALE);
                scales.push(ParamSpec {
                    name: WEIGHT_SCALE,
                    dims: p.dims[..1].to_vec(),
                    init: Init::Constant(1.0),
                    dtype: DType::F32,
                });
            }
        }
        params.extend(scales);
        params
    }

    /// State that is saved but not trained (batch-norm's running statistics).
    pub fn buffers(&self) -> Vec<ParamSpec> {
        match *self {
            LayerSpec::BatchNorm2d { channels } => vec![
                ParamSpec {
                    name: "running_mean",
                    dims: vec![channels],
                    init: Init::Constant(0.0),
                    dtype: DType::F32,
                },
                ParamSpec {
                    name: "running_var",
                    dims: vec![channels],
                    init: Init::Constant(1.0),
                    dtype: DType::F32,
                },
            ],
            _ => vec![],
        }
    }

    /// The input this layer expects, for messages: `[.., 784]`.
    pub fn expected_input(&self) -> String {
        match self {
            LayerSpec::Linear { inputs, .. } => format!("[.., {inputs}]"),
            LayerSpec::Conv2d { inputs, .. } => format!("[N, {inputs}, H, W]"),
            LayerSpec::BatchNorm2d { channels } => format!("[N, {channels}, H, W]"),
            LayerSpec::MaxPool2d { .. } | LayerSpec::AvgPool2d { .. } => "[N, C, H, W]".into(),
            LayerSpec::LayerNorm { features } => format!("[.., {features}]"),
            LayerSpec::Embedding { .. } => "integer ids of any shape".into(),
            LayerSpec::Dropout { .. } => "any shape".into(),
            LayerSpec::Flatten => "[N, ..]".into(),
        }
    }

    /// Checks an input's dims: `Err` says what was expected (see `expected_input`).
    pub fn check_input<D: SymDim>(&self, dims: &[D]) -> std::result::Result<(), String> {
        let last_is = |n: usize| {
            dims.last()
                .is_some_and(|d| d.matches(&D::lit(n)) != Some(false))
        };
        let ok = match self {
            LayerSpec::Linear { inputs, .. } => last_is(*inputs),
            LayerSpec::LayerNorm { features } => last_is(*features),
            LayerSpec::Conv2d { inputs, .. } => {
                dims.len() == 4 && dims[1].matches(&D::lit(*inputs)) != Some(false)
            }
            LayerSpec::BatchNorm2d { channels } => {
                dims.len() == 4 && dims[1].matches(&D::lit(*channels)) != Some(false)
            }
            LayerSpec::MaxPool2d { .. } | LayerSpec::AvgPool2d { .. } => dims.len() == 4,
            LayerSpec::Flatten => !dims.is_empty(),
            LayerSpec::Embedding { .. } | LayerSpec::Dropout { .. } => true,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{self} expects input {}, got {}",
                self.expected_input(),
                fmt_dims(dims)
            ))
        }
    }

    /// The forward pass over `params` (in `params()` order, then `buffers()` order).
    pub fn forward<G: Builder>(
        &self,
        g: &mut G,
        params: &[&G::Value],
        x: &G::Value,
        mode: Mode,
    ) -> Result<LayerOut<G::Value>> {
        let out = |y| Ok(LayerOut { y, updates: vec![] });
        let dims = g.dims(x);
        g.guard(Guard::LayerInput(self.clone()), &[x])?;
        match *self {
            LayerSpec::Linear { .. } if g.dtype(params[0]) == DType::I8 => {
                let y = g.matmul_int8(x, params[0], int8_scale(params)?)?;
                out(g.add(&y, params[1])?)
            }
            LayerSpec::Linear { .. } => out(g.linear(x, params[0], Some(params[1]))?),
            LayerSpec::Conv2d {
                stride,
                padding,
                groups,
                ..
            } => {
                let options = Conv2dOptions {
                    stride: [stride; 2],
                    padding: [padding; 2],
                    dilation: [1; 2],
                    groups,
                };
                out(g.conv2d(x, params[0], Some(params[1]), options)?)
            }
            LayerSpec::MaxPool2d { kernel, stride } => {
                out(g.max_pool2d(x, [kernel; 2], [stride; 2], [0; 2])?)
            }
            LayerSpec::AvgPool2d { kernel, stride } => {
                out(g.avg_pool2d(x, [kernel; 2], [stride; 2], [0; 2])?)
            }
            LayerSpec::LayerNorm { .. } => {
                out(g.layer_norm(x, 1, Some(params[0]), Some(params[1]), LAYER_NORM_EPS)?)
            }
            LayerSpec::Embedding { .. } if g.dtype(params[0]) == DType::I8 => {
                out(g.embedding_int8(x, params[0], int8_scale(params)?)?)
            }
            LayerSpec::Embedding { .. } => out(g.embedding(x, params[0])?),
            LayerSpec::Dropout { percent } => match mode {
                Mode::Train { seed } => out(g.dropout(x, percent as f64 / 100.0, seed)?),
                Mode::Eval => out(x.clone()),
            },
            LayerSpec::Flatten => {
                let rest = dims[1..].iter().fold(G::Dim::lit(1), |a, d| a.mul(d));
                out(g.reshape(x, vec![dims[0].clone(), rest])?)
            }
            LayerSpec::BatchNorm2d { channels } => {
                let c = G::Dim::lit(channels);
                let one = G::Dim::lit(1);
                let shape = vec![c.clone(), one.clone(), one.clone()];
                let w = g.reshape(params[0], shape.clone())?;
                let b = g.reshape(params[1], shape.clone())?;
                match mode {
                    Mode::Train { .. } => {
                        g.guard(Guard::BatchNormTraining, &[x])?;
                        let mean = g.mean(x, &[0, 2, 3], true)?;
                        let centered = g.sub(x, &mean)?;
                        let sq = g.square(&centered)?;
                        let var = g.mean(&sq, &[0, 2, 3], true)?;
                        let ve = g.add_scalar(&var, BATCH_NORM_EPS)?;
                        let inv = g.unary(crate::op::UnaryOp::Rsqrt, &ve)?;
                        // `x · scale + shift` with one scale and shift per channel (as
                        // PyTorch's kernels apply it): the backward pass then reduces
                        // `dy`, `dy · x` and the variance's own term over the
                        // activations, three passes where `(x - mean) · inv · w + b`
                        // made four, the largest of them reading five tensors.
                        let (scale, shift) = batch_norm_affine(g, &mean, &inv, &w, &b)?;
                        let y = g.mul(x, &scale)?;
                        let y = g.add(&y, &shift)?;
                        // Running statistics use the unbiased variance, as PyTorch does:
                        // var · n/(n-1), written 1/(1 - 1/n) so a symbolic n works too.
                        let n = dims[0].mul(&dims[2]).mul(&dims[3]);
                        let m = BATCH_NORM_MOMENTUM;
                        let flat = vec![c];
                        let mean_c = g.reshape(&mean, flat.clone())?;
                        let var_c = g.reshape(&var, flat)?;
                        let var_u = match n.as_lit() {
                            Some(n) if n > 1 => g.mul_scalar(&var_c, n as f64 / (n - 1) as f64)?,
                            Some(_) => var_c.clone(),
                            None => {
                                let r = g.recip_dim(&var_c, &n)?;
                                let r = g.mul_scalar(&r, -1.0)?;
                                let r = g.add_scalar(&r, 1.0)?;
                                let f = g.unary(crate::op::UnaryOp::Recip, &r)?;
                                g.mul(&var_c, &f)?
                            }
                        };
                        let rm = g.mul_scalar(params[2], 1.0 - m)?;
                        let new_mean = g.mul_scalar(&mean_c, m)?;
                        let new_mean = g.add(&rm, &new_mean)?;
                        let rv = g.mul_scalar(params[3], 1.0 - m)?;
                        let new_var = g.mul_scalar(&var_u, m)?;
                        let new_var = g.add(&rv, &new_var)?;
                        Ok(LayerOut {
                            y,
                            updates: vec![("running_mean", new_mean), ("running_var", new_var)],
                        })
                    }
                    Mode::Eval => {
                        let mean = g.reshape(params[2], shape.clone())?;
                        let var = g.reshape(params[3], shape)?;
                        let ve = g.add_scalar(&var, BATCH_NORM_EPS)?;
                        let inv = g.unary(crate::op::UnaryOp::Rsqrt, &ve)?;
                        let (scale, shift) = batch_norm_affine(g, &mean, &inv, &w, &b)?;
                        let y = g.mul(x, &scale)?;
                        out(g.add(&y, &shift)?)
                    }
                }
            }
        }
    }
}

/// Batch norm's per-channel `scale = inv · w` and `shift = b - mean · scale`, which
/// training and evaluation apply to `x` alike.
fn batch_norm_affine<G: Builder + ?Sized>(
    g: &mut G,
    mean: &G::Value,
    inv: &G::Value,
    w: &G::Value,
    b: &G::Value,
) -> Result<(G::Value, G::Value)> {
    let scale = g.mul(inv, w)?;
    let moved = g.mul(mean, &scale)?;
    let shift = g.sub(b, &moved)?;
    Ok((scale, shift))
}

impl std::fmt::Display for LayerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayerSpec::Linear { inputs, outputs } => write!(f, "Linear<{inputs}, {outputs}>"),
            LayerSpec::Conv2d {
                inputs,
                outputs,
                kernel,
                stride,
                padding,
                groups,
            } => {
                write!(f, "Conv2d<{inputs}, {outputs}, {kernel}")?;
                if (*stride, *padding, *groups) != (1, 0, 1) {
                    write!(f, ", {stride}, {padding}")?;
                    if *groups != 1 {
                        write!(f, ", {groups}")?;
                    }
                }
                write!(f, ">")
            }
            LayerSpec::MaxPool2d { kernel, stride } => write!(f, "MaxPool2d<{kernel}, {stride}>"),
            LayerSpec::AvgPool2d { kernel, stride } => write!(f, "AvgPool2d<{kernel}, {stride}>"),
            LayerSpec::BatchNorm2d { channels } => write!(f, "BatchNorm2d<{channels}>"),
            LayerSpec::LayerNorm { features } => write!(f, "LayerNorm<{features}>"),
            LayerSpec::Embedding { vocab, features } => write!(f, "Embedding<{vocab}, {features}>"),
            LayerSpec::Dropout { percent } => write!(f, "Dropout<{percent}>"),
            LayerSpec::Flatten => write!(f, "Flatten"),
        }
    }
}
