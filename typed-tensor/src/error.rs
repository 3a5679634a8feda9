//! Errors: everything a user can get wrong at run time, and everything a backend can fail at.

use crate::dtype::DType;

/// The result type of every fallible Kiln operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes do not fit the op (names the op and both shapes).
    #[error("shape mismatch in `{op}`: {msg}")]
    Shape {
        /// The op's name from the op table.
        op: &'static str,
        /// What did not fit, with the shapes involved.
        msg: String,
    },
    /// Dtypes do not fit the op.
    #[error("dtype mismatch in `{op}`: {msg}")]
    DType {
        /// The op's name from the op table.
        op: &'static str,
        /// What did not fit, with the dtypes involved.
        msg: String,
    },
    /// An argument is out of range (an axis, a slice bound, a probability...).
    #[error("invalid argument to `{op}`: {msg}")]
    Invalid {
        /// The op or function that refused the argument.
        op: &'static str,
        /// What was wrong with it.
        msg: String,
    },
    /// The backend cannot run this op for this dtype.
    #[error("`{op}` is not supported by the {backend} backend for dtype {dtype}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// The backend's name.
        backend: &'static str,
        /// The dtype it was asked for.
        dtype: DType,
    },
    /// Tensors on different devices met in one op.
    #[error("device mismatch in `{op}`: {lhs} vs {rhs}")]
    DeviceMismatch {
        /// The op's name.
        op: &'static str,
        /// The first device.
        lhs: String,
        /// The other device.
        rhs: String,
    },
    /// The device ran out of memory.
    #[error("out of memory on {device}: could not allocate {bytes} bytes")]
    OutOfMemory {
        /// The device, in words.
        device: String,
        /// The size of the failed allocation.
        bytes: usize,
    },
    /// A device or driver failure (missing device, failed launch, lost context...).
    #[error("device error: {0}")]
    Device(String),
    /// Anomaly mode found a value that is not finite ([`crate::anomaly`]): the op
    /// that first produced one, or the input or parameter that held one.
    #[error("anomaly: {0}")]
    NonFinite(String),
    /// A malformed or mismatched checkpoint or data file.
    #[error("{0}")]
    Format(String),
    /// An I/O failure.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    /// An index outside the axis it indexes (gather, scatter-add, embedding ids): one
    /// message whichever kernel found it.
    pub fn index_out_of_range(op: &'static str, index: i64, bound: usize) -> Self {
        Error::invalid(
            op,
            format!("index {index} is out of range for an axis of size {bound}"),
        )
    }

    /// The index and the axis's size of a gather's index out of range (the CPU's
    /// [`Error::index_out_of_range`], or a GPU kernel's report, which names the axis),
    /// so a caller that knows what the gather read (an embedding's ids, cross-entropy's
    /// labels) can say so; `None` for any other error.
    pub fn gather_index_out_of_range(&self) -> Option<(i64, usize)> {
        let Error::Invalid { op: "gather", msg } = self else {
            return None;
        };
        let (index, rest) = msg
            .strip_prefix("index ")?
            .split_once(" is out of range for ")?;
        let bound = match rest.strip_prefix("an axis of size ") {
            Some(bound) => bound,
            // `axis 1 of size 3 (kernels run asynchronously: ..)`
            None => rest.strip_prefix("axis ")?.split_once(" of size ")?.1,
        };
        let digits = bound.split(|c: char| !c.is_ascii_digit()).next()?;
        Some((index.parse().ok()?, digits.parse().ok()?))
    }

    /// A shape error for `op`.
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Shape {
            op,
            msg: msg.into(),
        }
    }
    /// A dtype error for `op`.
    pub fn dtype(op: &'static str, msg: impl Into<String>) -> Self {
        Error::DType {
            op,
            msg: msg.into(),
        }
    }
    /// An invalid-argument error for `op`.
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            msg: msg.into(),
        }
    }

    /// The same error, its message followed by where it happened (`context`: "in
    /// `self.router`, called on f32 [4, 31]"); errors without a message of their own
    /// (I/O, devices) stay as they are.
    pub fn with_context(self, context: &str) -> Self {
        match self {
            Error::Shape { op, msg } => Error::Shape {
                op,
                msg: format!("{msg} ({context})"),
            },
            Error::DType { op, msg } => Error::DType {
                op,
                msg: format!("{msg} ({context})"),
            },
            Error::Invalid { op, msg } => Error::Invalid {
                op,
                msg: format!("{msg} ({context})"),
            },
            Error::Format(msg) => Error::Format(format!("{msg} ({context})")),
            e => e,
        }
    }
}

#[cfg(test)]
mod gather_index_tests {
    use super::Error;

    #[test]
    fn a_gathers_index_out_of_range_is_read_back_from_either_backends_words() {
        let cpu = Error::index_out_of_range("gather", 12, 10);
        assert_eq!(cpu.gather_index_out_of_range(), Some((12, 10)));
        let gpu = Error::invalid(
            "gather",
            "index -1 is out of range for axis 1 of size 3 (kernels run asynchronously: \
             reported at the next read or synchronisation)",
        );
        assert_eq!(gpu.gather_index_out_of_range(), Some((-1, 3)));
        // Another op's, or another error of a gather, is not one.
        assert_eq!(
            Error::index_out_of_range("scatter_add", 1, 1).gather_index_out_of_range(),
            None
        );
        assert_eq!(
            Error::invalid("gather", "indices must be i32 or u32, not f32")
                .gather_index_out_of_range(),
            None
        );
    }
}
