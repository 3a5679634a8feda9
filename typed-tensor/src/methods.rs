//! The methods users call on tensors, declared once. [`for_each_method!`](crate::for_each_method!) is the table
//! of every method a `#[model]` body may call on a tensor besides the elementwise ops
//! of the op table: its name, the form of its call (what it reads from `::<..>` and
//! from its arguments), its documentation and its composition over a `Builder`. The
//! shape and dtype rules are those of the primitives it composes and the
//! [`Guard`](crate::Guard)s of its composite, so every spelling refuses the same
//! inputs with the same words. From the table come [`Method`] (which the macro looks
//! a call up in and applies to its symbolic graph), and the methods of every tensor
//! value that carries its own builder ([`tensor_methods!`](crate::tensor_methods!): the eager
//! [`crate::RawTensor`] and the dynamic path's lazy tensor); the typed
//! [`crate::Tensor`] methods call those.
//!
//! A method whose model-body form reads sizes or an axis from `::<..>` (`sum::<1>()`,
//! `reshape::<B, 12>()`) has a run-time form taking the same values as arguments; the
//! general ones (`sum(&[axes], keepdim)`, `reshape(&[dims])`) are written beside the
//! table in [`tensor_methods!`](crate::tensor_methods!), and the table's entry says how the model-body call
//! maps onto it.

use crate::builder::BuilderExt;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The table: one entry per method, `Variant name form(args) -> typed => |builder, x|
/// body;`. `typed` says what the typed [`crate::Tensor`] method returns: `same` (the
/// receiver's shape and dtype) and `scalar` (rank 0) are generated, `custom` ones are
/// written in `tensor.rs` with their shape-level rule (`matmul`'s `MatMulShape`).
/// Forms: `plain()` (`x.gelu()`), `axis_arg(axis)` (`x.softmax()` or `x.softmax(AXIS)`,
/// the last axis by default), `axis_turbofish(axis)` (`x.sum::<AXIS>()`),
/// `dims(dims)` (`x.reshape::<D0, D1>()`, at most one `Dyn`), `perm(perm)`
/// (`x.permute::<P0, P1>()`), `axis_range(axis, start, len)`
/// (`x.narrow::<AXIS, START, LEN>()`), `dtype(dtype)` (`x.cast::<bf16>()`), `tensor(rhs)`
/// (`a.mse(b)`), `axis_tensor(axis, rhs)` (`a.concat::<AXIS>(b)`) and
/// `tensor_scalar(rhs, s)` (`logits.cross_entropy_smoothed(labels, 0.1)`).
#[macro_export]
macro_rules! for_each_method {
    ($m:path) => {
        $m! {
            #[doc = "Adds a causal mask to attention scores `[.., T, T]`: row (query) `i` keeps columns (keys) `j <= i`."]
            CausalMask causal_mask plain() -> same => |b, x| b.causal_mask(x);
            #[doc = "GELU (erf form)."]
            Gelu gelu plain() -> same => |b, x| b.gelu_erf(x);
            #[doc = "GELU (tanh form)."]
            GeluTanh gelu_tanh plain() -> same => |b, x| b.gelu_tanh(x);
            #[doc = "x · sigmoid(x)."]
            Silu silu plain() -> same => |b, x| b.silu(x);
            #[doc = "x²."]
            Square square plain() -> same => |b, x| b.square(x);
            #[doc = "Σ over every element (rank 0)."]
            SumAll sum_all plain() -> custom => |b, x| b.sum_all(x);
            #[doc = "Mean over every element (rank 0)."]
            MeanAll mean_all plain() -> scalar => |b, x| b.mean_all(x);
            #[doc = "`[N, ..]` as `[N, rest]`: every axis after the first merged into one."]
            Flatten flatten plain() -> custom => |b, x| b.flatten(x);
            #[doc = "Swaps the last two axes (a view)."]
            T t plain() -> custom => |b, x| b.t(x);
            #[doc = "Softmax along an axis (in model bodies the last unless given)."]
            Softmax softmax axis_arg(axis) -> custom => |b, x| b.softmax(x, axis);
            #[doc = "Log-softmax along an axis (in model bodies the last unless given)."]
            LogSoftmax log_softmax axis_arg(axis) -> custom => |b, x| b.log_softmax(x, axis);
            #[doc = "Σ over one axis, removing it (run time: `sum(&[axis], false)`)."]
            Sum sum axis_turbofish(axis) -> custom => |b, x| b.sum(x, &[axis], false);
            #[doc = "Mean over one axis, removing it (run time: `mean(&[axis], false)`)."]
            Mean mean axis_turbofish(axis) -> custom => |b, x| b.mean(x, &[axis], false);
            #[doc = "Maximum over one axis, removing it (run time: `max(&[axis], false)`)."]
            Max max axis_turbofish(axis) -> custom => |b, x| b.max(x, &[axis], false);
            #[doc = "Index of the maximum along one axis, removing it (i32; run time: `argmax(axis, false)`)."]
            Argmax argmax axis_turbofish(axis) -> custom => |b, x| b.argmax(x, axis, false);
            #[doc = "Same elements, new dims; one may be `Dyn`, solved from the element count, and a `Dyn` leading size keeps rows whole (run time: `reshape(&dims)`)."]
            Reshape reshape dims(dims) -> custom => |b, x| b.reshape_open(x, dims);
            #[doc = "Same elements, new dims, regrouping rows on purpose: `reshape` whose open leading size may cut across the input's rows (`[2, 10]` into `[5, 4]`; run time: `reshape(&dims)`)."]
            Regroup regroup dims(dims) -> custom => |b, x| b.regroup(x, dims);
            #[doc = "Broadcasts to new dims (a view), `Dyn` keeping the input's size on that axis: an expansion written out, such as one side of an outer product (run time: `broadcast_to(&dims)`)."]
            BroadcastTo broadcast_to dims(dims) -> custom => |b, x| b.expand_open(x, dims);
            #[doc = "Reorders the axes (a view; run time: `permute(&perm)`)."]
            Permute permute perm(perm) -> custom => |b, x| b.permute(x, &perm);
            #[doc = "`LEN` elements from `START` along `AXIS` (a view; run time: `slice(axis, start, start + len, 1)`)."]
            Narrow narrow axis_range(axis, start, len) -> custom => |b, x| b.narrow(x, axis, start, len);
            #[doc = "Converts the dtype (run time: `cast(dtype)`)."]
            Cast cast dtype(dtype) -> custom => |b, x| b.cast(x, dtype);
            #[doc = "Matrix product, batched over leading axes (`[.., M, K] × [.., K, N]` or `× [K, N]`)."]
            Matmul matmul tensor(rhs) -> custom => |b, x| b.matmul(x, rhs);
            #[doc = "Mean squared error against a tensor of the same shape (rank 0; no broadcasting)."]
            Mse mse tensor(rhs) -> custom => |b, x| b.mse(x, rhs);
            #[doc = "Mean cross-entropy of logits `[N, C]` against integer labels `[N]` (rank 0)."]
            CrossEntropy cross_entropy tensor(labels) -> custom => |b, x| b.cross_entropy(x, labels, 0.0);
            #[doc = "Mean cross-entropy with label smoothing in [0, 1)."]
            CrossEntropySmoothed cross_entropy_smoothed tensor_scalar(labels, smoothing) -> custom => |b, x| b.cross_entropy(x, labels, smoothing);
            #[doc = "Joins two tensors along an axis (run time: `concat(&[a, b], axis)`)."]
            Concat concat axis_tensor(axis, rhs) -> custom => |b, x| b.concat(&[x, rhs], axis);
        }
    };
}

/// What a table method reads from a call besides its receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `x.gelu()`: nothing.
    Plain,
    /// `x.softmax()` or `x.softmax(AXIS)`: an optional axis argument (the last axis).
    AxisArg,
    /// `x.sum::<AXIS>()`: one axis in the turbofish.
    AxisTurbofish,
    /// `x.reshape::<D0, D1>()`: dims in the turbofish, at most one `Dyn`.
    Dims,
    /// `x.permute::<P0, P1>()`: an order of the axes in the turbofish.
    Perm,
    /// `x.narrow::<AXIS, START, LEN>()`: an axis and a range of it in the turbofish.
    AxisRange,
    /// `x.cast::<bf16>()`: a dtype in the turbofish.
    DType,
    /// `a.mse(b)`: one tensor argument.
    Tensor,
    /// `a.concat::<AXIS>(b)`: an axis in the turbofish and one tensor argument.
    AxisTensor,
    /// `logits.cross_entropy_smoothed(labels, 0.1)`: a tensor and a number.
    TensorScalar,
}

impl Form {
    /// The call as a model body writes it, for messages: `.sum::<AXIS>()`.
    pub fn spelling(self, name: &str) -> String {
        match self {
            Form::Plain => format!(".{name}()"),
            Form::AxisArg => format!(".{name}() or .{name}(AXIS)"),
            Form::AxisTurbofish => format!(".{name}::<AXIS>()"),
            Form::Dims => format!(".{name}::<D0, D1, ..>()"),
            Form::Perm => format!(".{name}::<P0, P1, ..>()"),
            Form::AxisRange => format!(".{name}::<AXIS, START, LEN>()"),
            Form::DType => format!(".{name}::<DTYPE>()"),
            Form::Tensor => format!(".{name}(other)"),
            Form::AxisTensor => format!(".{name}::<AXIS>(other)"),
            Form::TensorScalar => format!(".{name}(other, NUMBER)"),
        }
    }

    /// Whether the call takes `::<..>` arguments.
    pub fn takes_turbofish(self) -> bool {
        matches!(
            self,
            Form::AxisTurbofish
                | Form::Dims
                | Form::Perm
                | Form::AxisRange
                | Form::DType
                | Form::AxisTensor
        )
    }

    /// How many arguments the call takes (at most; `AxisArg`'s is optional).
    pub fn arguments(self) -> usize {
        match self {
            Form::Plain
            | Form::AxisTurbofish
            | Form::Dims
            | Form::Perm
            | Form::AxisRange
            | Form::DType => 0,
            Form::AxisArg | Form::Tensor | Form::AxisTensor => 1,
            Form::TensorScalar => 2,
        }
    }
}

/// The values of one call of a table method, as its [`Form`] reads them.
#[derive(Debug)]
pub enum MethodArgs<'a, V, D> {
    /// [`Form::Plain`].
    None,
    /// [`Form::AxisArg`] (`None`: the last axis) and [`Form::AxisTurbofish`].
    Axis(Option<usize>),
    /// [`Form::Dims`]: `None` is a size solved from the element count.
    Dims(Vec<Option<D>>),
    /// [`Form::Perm`].
    Perm(Vec<usize>),
    /// [`Form::AxisRange`]: the axis, the first index and the count.
    AxisRange(usize, usize, usize),
    /// [`Form::DType`].
    DType(DType),
    /// [`Form::Tensor`].
    Tensor(&'a V),
    /// [`Form::AxisTensor`].
    AxisTensor(usize, &'a V),
    /// [`Form::TensorScalar`].
    TensorScalar(&'a V, f64),
}

/// Binds an entry's arguments from a call's [`MethodArgs`], or says the call does not
/// fit the form (a caller's mistake: the macro reads a call by its form first).
#[doc(hidden)]
#[macro_export]
macro_rules! __method_args {
    (plain, $a:expr, $x:expr, $b:expr, ()) => {
        let $crate::MethodArgs::None = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (axis_arg, $a:expr, $x:expr, $b:expr, ($axis:ident)) => {
        let $crate::MethodArgs::Axis($axis) = $a else {
            return Err($crate::methods::misfit());
        };
        let $axis = $axis.unwrap_or_else(|| $crate::BuilderExt::rank($b, $x).saturating_sub(1));
    };
    (axis_turbofish, $a:expr, $x:expr, $b:expr, ($axis:ident)) => {
        let $crate::MethodArgs::Axis(Some($axis)) = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (dims, $a:expr, $x:expr, $b:expr, ($dims:ident)) => {
        let $crate::MethodArgs::Dims($dims) = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (perm, $a:expr, $x:expr, $b:expr, ($perm:ident)) => {
        let $crate::MethodArgs::Perm($perm) = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (axis_range, $a:expr, $x:expr, $b:expr, ($axis:ident, $start:ident, $len:ident)) => {
        let $crate::MethodArgs::AxisRange($axis, $start, $len) = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (dtype, $a:expr, $x:expr, $b:expr, ($dtype:ident)) => {
        let $crate::MethodArgs::DType($dtype) = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (tensor, $a:expr, $x:expr, $b:expr, ($rhs:ident)) => {
        let $crate::MethodArgs::Tensor($rhs) = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (axis_tensor, $a:expr, $x:expr, $b:expr, ($axis:ident, $rhs:ident)) => {
        let $crate::MethodArgs::AxisTensor($axis, $rhs) = $a else {
            return Err($crate::methods::misfit());
        };
    };
    (tensor_scalar, $a:expr, $x:expr, $b:expr, ($rhs:ident, $s:ident)) => {
        let $crate::MethodArgs::TensorScalar($rhs, $s) = $a else {
            return Err($crate::methods::misfit());
        };
    };
}

/// The [`Form`] variant of an entry's form keyword.
#[doc(hidden)]
#[macro_export]
macro_rules! __method_form {
    (plain) => {
        $crate::methods::Form::Plain
    };
    (axis_arg) => {
        $crate::methods::Form::AxisArg
    };
    (axis_turbofish) => {
        $crate::methods::Form::AxisTurbofish
    };
    (dims) => {
        $crate::methods::Form::Dims
    };
    (perm) => {
        $crate::methods::Form::Perm
    };
    (axis_range) => {
        $crate::methods::Form::AxisRange
    };
    (dtype) => {
        $crate::methods::Form::DType
    };
    (tensor) => {
        $crate::methods::Form::Tensor
    };
    (axis_tensor) => {
        $crate::methods::Form::AxisTensor
    };
    (tensor_scalar) => {
        $crate::methods::Form::TensorScalar
    };
}

#[doc(hidden)]
pub fn misfit() -> Error {
    Error::invalid(
        "method",
        "the call's arguments do not fit the method's form",
    )
}

macro_rules! method_enum {
    ($( #[doc = $doc:literal] $v:ident $name:ident $form:ident ( $($arg:ident),* ) -> $typed:ident => |$b:ident, $x:ident| $body:expr ; )*) => {
        /// A method of the table ([`for_each_method!`](crate::for_each_method!)).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Method {
            $(#[doc = $doc] $v,)*
        }

        impl Method {
            /// Every method, in table order.
            pub const ALL: &'static [Method] = &[$(Method::$v),*];

            /// The method's name as users call it.
            pub fn name(self) -> &'static str {
                match self { $(Method::$v => stringify!($name),)* }
            }

            /// The form of its call.
            pub fn form(self) -> Form {
                match self { $(Method::$v => $crate::__method_form!($form),)* }
            }

            /// Its one-line documentation.
            pub fn doc(self) -> &'static str {
                match self { $(Method::$v => $doc,)* }
            }

            /// The method called `name`, if the table has one.
            pub fn from_name(name: &str) -> Option<Method> {
                Method::ALL.iter().copied().find(|m| m.name() == name)
            }

            /// Applies the method to `x` on any builder: its composition over the
            /// primitives, whose rules and the composite's guards check the operands.
            pub fn apply<Bd: BuilderExt + ?Sized>(
                self,
                builder: &mut Bd,
                x: &Bd::Value,
                args: MethodArgs<'_, Bd::Value, Bd::Dim>,
            ) -> Result<Bd::Value> {
                match self {
                    $(Method::$v => {
                        $crate::__method_args!($form, args, x, builder, ($($arg),*));
                        let ($b, $x) = (builder, x);
                        $body
                    })*
                }
            }
        }
    };
}

for_each_method!(method_enum);

/// Writes the tensor method API inside an `impl` of a type whose values have a method
/// `ops(&self)` returning a `Builder` with `Dim = usize` and `Value = Self`.
#[macro_export]
macro_rules! tensor_methods {
    () => {
        $crate::for_each_unary!($crate::__tensor_unary_methods);
        $crate::for_each_binary!($crate::__tensor_binary_methods);
        $crate::for_each_method!($crate::__tensor_table_methods);

        /// An elementwise comparison (bool result).
        pub fn compare(&self, op: $crate::CmpOp, rhs: &Self) -> $crate::Result<Self> {
            $crate::BuilderExt::compare(&mut self.ops(), op, self, rhs)
        }
        /// `self ? a : b` (self is the bool condition).
        pub fn select(&self, a: &Self, b: &Self) -> $crate::Result<Self> {
            $crate::BuilderExt::select(&mut self.ops(), self, a, b)
        }
        /// x + s
        pub fn add_scalar(&self, s: f64) -> $crate::Result<Self> {
            $crate::BuilderExt::add_scalar(&mut self.ops(), self, s)
        }
        /// x * s
        pub fn mul_scalar(&self, s: f64) -> $crate::Result<Self> {
            $crate::BuilderExt::mul_scalar(&mut self.ops(), self, s)
        }
        /// Σ over `axes`.
        pub fn sum(&self, axes: &[usize], keepdim: bool) -> $crate::Result<Self> {
            $crate::BuilderExt::sum(&mut self.ops(), self, axes, keepdim)
        }
        /// Mean over `axes`.
        pub fn mean(&self, axes: &[usize], keepdim: bool) -> $crate::Result<Self> {
            $crate::BuilderExt::mean(&mut self.ops(), self, axes, keepdim)
        }
        /// Maximum over `axes`.
        pub fn max(&self, axes: &[usize], keepdim: bool) -> $crate::Result<Self> {
            $crate::BuilderExt::max(&mut self.ops(), self, axes, keepdim)
        }
        /// Minimum over `axes`.
        pub fn min(&self, axes: &[usize], keepdim: bool) -> $crate::Result<Self> {
            $crate::BuilderExt::reduce(&mut self.ops(), $crate::ReduceOp::Min, self, axes, keepdim)
        }
        /// Index of the maximum along `axis` (i32).
        pub fn argmax(&self, axis: usize, keepdim: bool) -> $crate::Result<Self> {
            $crate::BuilderExt::argmax(&mut self.ops(), self, axis, keepdim)
        }
        /// Index of the minimum along `axis` (i32).
        pub fn argmin(&self, axis: usize, keepdim: bool) -> $crate::Result<Self> {
            $crate::BuilderExt::reduce(
                &mut self.ops(),
                $crate::ReduceOp::ArgMin,
                self,
                &[axis],
                keepdim,
            )
        }
        /// Same elements, new dims (a view when the layout allows).
        pub fn reshape(&self, dims: &[usize]) -> $crate::Result<Self> {
            $crate::BuilderExt::reshape(&mut self.ops(), self, dims.to_vec())
        }
        /// Reorders dims (a view).
        pub fn permute(&self, perm: &[usize]) -> $crate::Result<Self> {
            $crate::BuilderExt::permute(&mut self.ops(), self, perm)
        }
        /// Swaps two axes (a view).
        pub fn transpose(&self, a: usize, b: usize) -> $crate::Result<Self> {
            $crate::BuilderExt::transpose(&mut self.ops(), self, a, b)
        }
        /// Broadcasts to `dims` (a view).
        pub fn broadcast_to(&self, dims: &[usize]) -> $crate::Result<Self> {
            $crate::BuilderExt::expand(&mut self.ops(), self, dims.to_vec())
        }
        /// `start..end` by `step` along `axis` (a view).
        pub fn slice(
            &self,
            axis: usize,
            start: usize,
            end: usize,
            step: usize,
        ) -> $crate::Result<Self> {
            $crate::Builder::apply(
                &mut self.ops(),
                $crate::Op::Slice {
                    axis,
                    start,
                    end,
                    step,
                },
                &[self],
            )
        }
        /// Joins tensors along `axis`.
        pub fn concat(tensors: &[&Self], axis: usize) -> $crate::Result<Self> {
            let first = tensors
                .first()
                .ok_or_else(|| $crate::Error::invalid("concat", "needs at least one tensor"))?;
            $crate::BuilderExt::concat(&mut first.ops(), tensors, axis)
        }
        /// Pads `axis` with `before`/`after` elements of `value`.
        pub fn pad(
            &self,
            axis: usize,
            before: usize,
            after: usize,
            value: f64,
        ) -> $crate::Result<Self> {
            $crate::BuilderExt::pad(&mut self.ops(), self, axis, before, after, value)
        }
        /// PyTorch's gather along `axis`.
        pub fn gather(&self, axis: usize, index: &Self) -> $crate::Result<Self> {
            $crate::BuilderExt::gather(&mut self.ops(), self, axis, index)
        }
        /// Zeros of `dims` with `self` (the source) added at `index` along `axis`.
        pub fn scatter_add(
            &self,
            dims: &[usize],
            axis: usize,
            index: &Self,
        ) -> $crate::Result<Self> {
            $crate::BuilderExt::scatter_add(&mut self.ops(), dims.to_vec(), axis, index, self)
        }
        /// Converts the dtype.
        pub fn cast(&self, dtype: $crate::DType) -> $crate::Result<Self> {
            $crate::BuilderExt::cast(&mut self.ops(), self, dtype)
        }
    };
}

/// One method per unary op of the op table (`x.relu()`, `x.logical_not()`).
#[doc(hidden)]
#[macro_export]
macro_rules! __tensor_unary_methods {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $domain:ident]
        compute($x:ident) $formula:block
        grad($b:ident, $gx:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        $(
            $(#[$doc])*
            pub fn $method(&self) -> $crate::Result<Self> {
                $crate::BuilderExt::unary(&mut self.ops(), $crate::UnaryOp::$v, self)
            }
        )*
    };
}

/// One method per binary op of the op table (`a.add(&b)`, `a.maximum(&b)`), broadcasting
/// one operand at most ([`BuilderExt::checked_binary`](crate::BuilderExt::checked_binary)).
#[doc(hidden)]
#[macro_export]
macro_rules! __tensor_binary_methods {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $da:ident, $db:ident]
        compute($x:ident, $y:ident) $formula:block
        grad($bd:ident, $ga:ident, $gb:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        $(
            $(#[$doc])*
            pub fn $method(&self, rhs: &Self) -> $crate::Result<Self> {
                $crate::BuilderExt::checked_binary(&mut self.ops(), $crate::BinaryOp::$v, self, rhs)
            }
        )*
    };
}

/// The table's methods whose run-time form is their model-body form (`x.mse(&y)`,
/// `x.softmax(axis)`); the others' run-time forms are the general methods of
/// [`tensor_methods!`](crate::tensor_methods!).
#[doc(hidden)]
#[macro_export]
macro_rules! __tensor_table_methods {
    ($( #[doc = $doc:literal] $v:ident $name:ident $form:ident ( $($arg:ident),* ) -> $typed:ident => |$b:ident, $x:ident| $body:expr ; )*) => {
        $( $crate::__tensor_table_method!(#[doc = $doc] $v $name $form ($($arg),*)); )*
    };
}

/// One run-time method of the table (see [`__tensor_table_methods!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __tensor_table_method {
    (#[doc = $doc:literal] $v:ident $name:ident plain ()) => {
        #[doc = $doc]
        pub fn $name(&self) -> $crate::Result<Self> {
            $crate::Method::$v.apply(&mut self.ops(), self, $crate::MethodArgs::None)
        }
    };
    (#[doc = $doc:literal] $v:ident $name:ident axis_arg ($axis:ident)) => {
        #[doc = $doc]
        pub fn $name(&self, $axis: usize) -> $crate::Result<Self> {
            $crate::Method::$v.apply(&mut self.ops(), self, $crate::MethodArgs::Axis(Some($axis)))
        }
    };
    (#[doc = $doc:literal] $v:ident $name:ident tensor ($rhs:ident)) => {
        #[doc = $doc]
        pub fn $name(&self, $rhs: &Self) -> $crate::Result<Self> {
            $crate::Method::$v.apply(&mut self.ops(), self, $crate::MethodArgs::Tensor($rhs))
        }
    };
    (#[doc = $doc:literal] $v:ident $name:ident axis_range ($axis:ident, $start:ident, $len:ident)) => {
        #[doc = $doc]
        pub fn $name(&self, $axis: usize, $start: usize, $len: usize) -> $crate::Result<Self> {
            $crate::Method::$v.apply(
                &mut self.ops(),
                self,
                $crate::MethodArgs::AxisRange($axis, $start, $len),
            )
        }
    };
    (#[doc = $doc:literal] $v:ident $name:ident tensor_scalar ($rhs:ident, $s:ident)) => {
        #[doc = $doc]
        pub fn $name(&self, $rhs: &Self, $s: f64) -> $crate::Result<Self> {
            $crate::Method::$v.apply(
                &mut self.ops(),
                self,
                $crate::MethodArgs::TensorScalar($rhs, $s),
            )
        }
    };
    (#[doc = $doc:literal] $v:ident $name:ident $form:ident ($($arg:ident),*)) => {};
}
