//! The method API of a tensor value that carries its own builder (`x.relu()`,
//! `a.matmul(&b)`, `x.softmax(1)`): written once here as [`tensor_methods!`], and
//! expanded into every such type's impl — the eager [`crate::RawTensor`] and the
//! dynamic path's lazy tensor — so both offer the same ops under the same names,
//! each delegating to its builder (`self.ops()`), and a new unary or binary op of the
//! op table becomes a method of both.

/// Writes the tensor method API inside an `impl` of a type whose values have a method
/// `ops(&self)` returning a `Builder` with `Dim = usize` and `Value = Self`.
#[macro_export]
macro_rules! tensor_methods {
    () => {
        $crate::for_each_unary!($crate::__tensor_unary_methods);
        $crate::for_each_binary!($crate::__tensor_binary_methods);

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
        /// Σ over everything (rank 0).
        pub fn sum_all(&self) -> $crate::Result<Self> {
            $crate::BuilderExt::sum_all(&mut self.ops(), self)
        }
        /// Mean over `axes`.
        pub fn mean(&self, axes: &[usize], keepdim: bool) -> $crate::Result<Self> {
            $crate::BuilderExt::mean(&mut self.ops(), self, axes, keepdim)
        }
        /// Mean over everything (rank 0).
        pub fn mean_all(&self) -> $crate::Result<Self> {
            $crate::BuilderExt::mean_all(&mut self.ops(), self)
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
        /// Batched matrix product.
        pub fn matmul(&self, rhs: &Self) -> $crate::Result<Self> {
            $crate::BuilderExt::matmul(&mut self.ops(), self, rhs)
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
        /// Softmax along `axis`.
        pub fn softmax(&self, axis: usize) -> $crate::Result<Self> {
            $crate::BuilderExt::softmax(&mut self.ops(), self, axis)
        }
        /// Log-softmax along `axis`.
        pub fn log_softmax(&self, axis: usize) -> $crate::Result<Self> {
            $crate::BuilderExt::log_softmax(&mut self.ops(), self, axis)
        }
        /// GELU (erf form).
        pub fn gelu(&self) -> $crate::Result<Self> {
            $crate::BuilderExt::gelu_erf(&mut self.ops(), self)
        }
        /// GELU (tanh form).
        pub fn gelu_tanh(&self) -> $crate::Result<Self> {
            $crate::BuilderExt::gelu_tanh(&mut self.ops(), self)
        }
        /// x · sigmoid(x)
        pub fn silu(&self) -> $crate::Result<Self> {
            $crate::BuilderExt::silu(&mut self.ops(), self)
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

/// One method per binary op of the op table (`a.add(&b)`, `a.maximum(&b)`), broadcasting.
#[doc(hidden)]
#[macro_export]
macro_rules! __tensor_binary_methods {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $da:ident, $db:ident]
        compute($x:ident, $y:ident) $formula:block
        grad($bd:ident, $ga:ident, $gb:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        $(
            $(#[$doc])*
            pub fn $method(&self, rhs: &Self) -> $crate::Result<Self> {
                $crate::BuilderExt::binary(&mut self.ops(), $crate::BinaryOp::$v, self, rhs)
            }
        )*
    };
}
