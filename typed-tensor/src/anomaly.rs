//! Anomaly mode: an opt-in check that every op's output is finite, so that a NaN or an
//! infinity is reported where it first appears (the op, its node, the parameters it
//! computes from) instead of as a loss of NaN many ops later. Off by default; on with
//! [`set_detect`] or the environment variable `KILN_ANOMALY=1`. While it is on, the
//! planned and the dynamic paths run op by op and read every value back to check it
//! (slow, as PyTorch's `detect_anomaly` is: for finding a fault, not for training).

use crate::backend::Backend;
use crate::dtype::HostData;
use crate::error::Result;
use crate::raw::RawTensor;
use std::sync::atomic::{AtomicU8, Ordering};

/// 0: not yet read from the environment; 1: off; 2: on.
static DETECT: AtomicU8 = AtomicU8::new(0);

/// Turns anomaly mode on or off for the whole process.
pub fn set_detect(on: bool) {
    DETECT.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether anomaly mode is on (first asked: `KILN_ANOMALY` set to `1`, `true` or
/// `on`).
pub fn detecting() -> bool {
    match DETECT.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("KILN_ANOMALY")
                .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "on"));
            // Another thread may have set it meanwhile; its choice wins.
            let _ = DETECT.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            DETECT.load(Ordering::Relaxed) == 2
        }
        state => state == 2,
    }
}

/// The first value of a tensor that is not finite, and how many are not.
#[derive(Clone, Debug, PartialEq)]
pub struct NonFinite {
    /// Its index, one entry per dim.
    pub index: Vec<usize>,
    /// The value (NaN, inf or -inf).
    pub value: f64,
    /// How many of the tensor's values are not finite.
    pub count: usize,
    /// How many values the tensor has.
    pub of: usize,
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at {:?} ({} of its {} values are not finite)",
            self.value, self.index, self.count, self.of
        )
    }
}

/// The first non-finite value of `t` (read to the host), or `None` when every value
/// is finite; integer and bool tensors have none.
#[inline(never)]
pub fn first_non_finite<B: Backend>(t: &RawTensor<B>) -> Result<Option<NonFinite>> {
    if !t.dtype().is_float() {
        return Ok(None);
    }
    let values: Vec<f64> = match t.to_host()? {
        HostData::F32(v) => v.into_iter().map(f64::from).collect(),
        HostData::F64(v) => v,
        HostData::F16(v) => v.into_iter().map(f64::from).collect(),
        HostData::BF16(v) => v.into_iter().map(f64::from).collect(),
        _ => return Ok(None),
    };
    let Some(first) = values.iter().position(|v| !v.is_finite()) else {
        return Ok(None);
    };
    let dims = t.dims().as_slice().to_vec();
    let mut index = vec![0; dims.len()];
    let mut rest = first;
    for (i, &d) in dims.iter().enumerate().rev() {
        index[i] = rest % d.max(1);
        rest /= d.max(1);
    }
    Ok(Some(NonFinite {
        index,
        value: values[first],
        count: values.iter().filter(|v| !v.is_finite()).count(),
        of: values.len(),
    }))
}

/// The error for `op` (described: "`log`", "the call to dynamic part 0") being the
/// first to produce a value that is not finite: `bad`, in a value of `dtype` and
/// `dims`, at `place` (its node, and its layer where known), its inputs finite;
/// `computes_from` names the parameters nearest upstream, `after` the named value it
/// follows. The planned and the dynamic paths report through this one message.
pub fn op_error(
    op: &str,
    bad: &NonFinite,
    dtype: crate::DType,
    dims: &[usize],
    place: &str,
    computes_from: &[String],
    after: Option<&str>,
) -> crate::Error {
    let mut msg = format!(
        "{op} is the first op whose output is not finite: {bad}, in {dtype} {} ({place}); its inputs are finite",
        crate::op::fmt_dims(dims)
    );
    let quoted: Vec<String> = computes_from.iter().map(|n| format!("`{n}`")).collect();
    match (quoted.is_empty(), after) {
        (false, Some(v)) => msg.push_str(&format!(
            ". It computes from {}, after `{v}`",
            quoted.join(", ")
        )),
        (false, None) => msg.push_str(&format!(". It computes from {}", quoted.join(", "))),
        (true, Some(v)) => msg.push_str(&format!(". It comes after `{v}`")),
        (true, None) => {}
    }
    crate::Error::NonFinite(msg)
}

/// The error for a value given to a computation (`what`: an input, a parameter)
/// already holding `bad`, which no op of this computation made.
pub fn given_error(what: &str, bad: &NonFinite) -> crate::Error {
    crate::Error::NonFinite(format!(
        "{what} holds {bad} before any op ran: it was given (an input, or a parameter an earlier step made non-finite), not computed there"
    ))
}
