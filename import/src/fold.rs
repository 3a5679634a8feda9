//! What a graph computes from constants and shapes, evaluated at import time: the
//! shape subgraphs exporters emit around attention (`Shape` → `Gather` → `Unsqueeze` →
//! `Concat` → `Reshape`) fold into sizes, literal or symbolic (`BATCH`), so the
//! generated source names them instead of computing them.

use crate::model::{Attribute, Node, Tensor, TensorData};
use kiln_fusion::SDim;
use kiln_tensor::SymDim;

/// A value known at import time.
#[derive(Clone, Debug, PartialEq)]
pub struct Folded {
    /// Its dims.
    pub dims: Vec<usize>,
    /// Its values, row-major.
    pub data: FoldedData,
}

/// A folded value's elements.
#[derive(Clone, Debug, PartialEq)]
pub enum FoldedData {
    /// Integers, each a literal or a symbolic size (`BATCH`, `2*SEQUENCE`).
    Ints(Vec<SDim>),
    /// Floats.
    Floats(Vec<f64>),
    /// Booleans.
    Bools(Vec<bool>),
}

impl Folded {
    /// A held tensor as a folded value.
    pub fn of(t: &Tensor) -> Self {
        let data = match &t.data {
            TensorData::F32(v) => FoldedData::Floats(v.iter().map(|&x| x as f64).collect()),
            TensorData::F64(v) => FoldedData::Floats(v.clone()),
            TensorData::I32(v) => FoldedData::Ints(v.iter().map(|&x| int(x as i64)).collect()),
            TensorData::I64(v) => FoldedData::Ints(v.iter().map(|&x| int(x)).collect()),
            TensorData::Bool(v) => FoldedData::Bools(v.clone()),
        };
        Folded {
            dims: t.dims.clone(),
            data,
        }
    }

    /// A rank-1 list of sizes.
    pub fn sizes(v: Vec<SDim>) -> Self {
        Folded {
            dims: vec![v.len()],
            data: FoldedData::Ints(v),
        }
    }

    /// Its elements as sizes, if it holds integers.
    pub fn ints(&self) -> Option<&[SDim]> {
        match &self.data {
            FoldedData::Ints(v) => Some(v),
            _ => None,
        }
    }

    /// Its one float, if it is a single float (or a single literal integer).
    pub fn scalar(&self) -> Option<f64> {
        match &self.data {
            FoldedData::Floats(v) if v.len() == 1 => Some(v[0]),
            FoldedData::Ints(v) if v.len() == 1 => v[0].as_lit().map(|n| n as f64),
            _ => None,
        }
    }

    /// How many elements.
    fn len(&self) -> usize {
        match &self.data {
            FoldedData::Ints(v) => v.len(),
            FoldedData::Floats(v) => v.len(),
            FoldedData::Bools(v) => v.len(),
        }
    }
}

/// An integer as a size: negative integers (ONNX's `-1`, "infer this dim") are kept as
/// literals of their two's complement only where they never become sizes; they are
/// looked at by the consumers that give them meaning ([`signed`]).
fn int(v: i64) -> SDim {
    SDim::lit(v as usize)
}

/// A folded integer as a signed number, where it is a literal.
pub fn signed(d: &SDim) -> Option<i64> {
    d.as_lit().map(|n| n as i64)
}

/// The ops [`fold`] evaluates.
pub const FOLDED: &[&str] = &[
    "Constant",
    "Shape",
    "Gather",
    "Unsqueeze",
    "Squeeze",
    "Concat",
    "Cast",
    "Identity",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Mod",
    "Pow",
    "Sqrt",
    "Slice",
    "Reshape",
];

/// Evaluates `node` at import time, its inputs folded values (`None`: not known at
/// import time, only its dims in `dims_of`). `None` when the node cannot be folded
/// (a dynamic input), otherwise its outputs or why they cannot be.
pub fn fold(
    node: &Node,
    inputs: &[Option<&Folded>],
    dims_of: &dyn Fn(usize) -> Option<Vec<SDim>>,
) -> Option<Result<Folded, String>> {
    let known = |i: usize| inputs.get(i).copied().flatten();
    let all_known = inputs.iter().all(Option::is_some);
    match node.op.as_str() {
        "Constant" => Some(constant(node)),
        "Shape" => {
            let dims = match known(0) {
                Some(f) => f.dims.iter().map(|&d| SDim::lit(d)).collect(),
                None => dims_of(0)?,
            };
            let rank = dims.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
            let start = clamp(int_attr(node, "start").unwrap_or(0));
            let end = clamp(int_attr(node, "end").unwrap_or(rank));
            Some(Ok(Folded::sizes(dims[start..end.max(start)].to_vec())))
        }
        _ if !all_known || inputs.is_empty() => None,
        "Identity" => Some(Ok(known(0)?.clone())),
        "Gather" => Some(gather(node, known(0)?, known(1)?)),
        "Unsqueeze" | "Squeeze" => Some(squeeze(node, known(0)?, known(1))),
        "Concat" => Some(concat(
            inputs.iter().map(|f| f.expect("all known")).collect(),
        )),
        "Cast" => Some(cast(node, known(0)?)),
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "Pow" => {
            Some(arithmetic(&node.op, known(0)?, known(1)?))
        }
        "Sqrt" => match &known(0)?.data {
            FoldedData::Floats(v) => Some(Ok(Folded {
                dims: known(0)?.dims.clone(),
                data: FoldedData::Floats(v.iter().map(|x| x.sqrt()).collect()),
            })),
            _ => Some(Err("a square root of integers".into())),
        },
        "Slice" => Some(slice(known(0)?, &inputs[1..])),
        "Reshape" => Some(reshape(known(0)?, known(1)?)),
        _ => None,
    }
}

fn int_attr(node: &Node, name: &str) -> Option<i64> {
    match node.attributes.get(name) {
        Some(Attribute::Int(v)) => Some(*v),
        _ => None,
    }
}

/// `Constant`'s value, from whichever attribute holds it.
fn constant(node: &Node) -> Result<Folded, String> {
    let a = |n| node.attributes.get(n);
    match (
        a("value"),
        a("value_int"),
        a("value_ints"),
        a("value_float"),
        a("value_floats"),
    ) {
        (Some(Attribute::Tensor(t)), ..) => Ok(Folded::of(t)),
        (_, Some(Attribute::Int(v)), ..) => Ok(Folded {
            dims: vec![],
            data: FoldedData::Ints(vec![int(*v)]),
        }),
        (_, _, Some(Attribute::Ints(v)), ..) => {
            Ok(Folded::sizes(v.iter().map(|&x| int(x)).collect()))
        }
        (_, _, _, Some(Attribute::Float(v)), _) => Ok(Folded {
            dims: vec![],
            data: FoldedData::Floats(vec![*v as f64]),
        }),
        (.., Some(Attribute::Floats(v))) => Ok(Folded {
            dims: vec![v.len()],
            data: FoldedData::Floats(v.iter().map(|&x| x as f64).collect()),
        }),
        _ => Err("a Constant without a value Kiln reads".into()),
    }
}

/// `Gather` along axis 0 of a rank-0 or rank-1 folded value.
fn gather(node: &Node, data: &Folded, index: &Folded) -> Result<Folded, String> {
    if int_attr(node, "axis").unwrap_or(0) != 0 || data.dims.len() != 1 {
        return Err("a Gather of import-time values other than one list's elements".into());
    }
    let n = data.dims[0] as i64;
    let picks: Vec<usize> = index
        .ints()
        .ok_or("a Gather by non-integer indices")?
        .iter()
        .map(|d| {
            let i = signed(d).ok_or("a Gather by a symbolic index")?;
            let i = if i < 0 { i + n } else { i };
            if (0..n).contains(&i) {
                Ok(i as usize)
            } else {
                Err(format!("a Gather of index {i} from {n} values"))
            }
        })
        .collect::<Result<_, String>>()?;
    let data = match &data.data {
        FoldedData::Ints(v) => FoldedData::Ints(picks.iter().map(|&i| v[i].clone()).collect()),
        FoldedData::Floats(v) => FoldedData::Floats(picks.iter().map(|&i| v[i]).collect()),
        FoldedData::Bools(v) => FoldedData::Bools(picks.iter().map(|&i| v[i]).collect()),
    };
    Ok(Folded {
        dims: index.dims.clone(),
        data,
    })
}

/// `Unsqueeze` (insert dims of 1) or `Squeeze` (remove them) at the axes of input 1.
fn squeeze(node: &Node, x: &Folded, axes: Option<&Folded>) -> Result<Folded, String> {
    let axes: Vec<i64> = match axes {
        Some(a) => a
            .ints()
            .ok_or("axes that are not integers")?
            .iter()
            .map(|d| signed(d).ok_or("symbolic axes"))
            .collect::<Result<_, _>>()?,
        None => vec![],
    };
    let mut dims = x.dims.clone();
    if node.op == "Unsqueeze" {
        let rank = (dims.len() + axes.len()) as i64;
        let mut at: Vec<usize> = axes
            .iter()
            .map(|&a| (if a < 0 { a + rank } else { a }) as usize)
            .collect();
        at.sort_unstable();
        for a in at {
            if a > dims.len() {
                return Err(format!("an Unsqueeze at axis {a} of rank {}", dims.len()));
            }
            dims.insert(a, 1);
        }
    } else if axes.is_empty() {
        dims.retain(|&d| d != 1);
    } else {
        let rank = dims.len() as i64;
        let at: Vec<usize> = axes
            .iter()
            .map(|&a| (if a < 0 { a + rank } else { a }) as usize)
            .collect();
        dims = dims
            .iter()
            .enumerate()
            .filter(|(i, _)| !at.contains(i))
            .map(|(_, &d)| d)
            .collect();
    }
    Ok(Folded {
        dims,
        data: x.data.clone(),
    })
}

/// `Concat` of rank-1 values.
fn concat(parts: Vec<&Folded>) -> Result<Folded, String> {
    let mut ints = Vec::new();
    let mut floats = Vec::new();
    for p in &parts {
        if p.dims.len() > 1 {
            return Err("a Concat of import-time values of rank over 1".into());
        }
        match &p.data {
            FoldedData::Ints(v) => ints.extend(v.iter().cloned()),
            FoldedData::Floats(v) => floats.extend(v.iter().copied()),
            FoldedData::Bools(_) => return Err("a Concat of booleans".into()),
        }
    }
    match (ints.is_empty(), floats.is_empty()) {
        (_, true) => Ok(Folded::sizes(ints)),
        (true, false) => Ok(Folded {
            dims: vec![floats.len()],
            data: FoldedData::Floats(floats),
        }),
        _ => Err("a Concat of integers and floats".into()),
    }
}

/// `Cast` between integers and floats of import-time values.
fn cast(node: &Node, x: &Folded) -> Result<Folded, String> {
    use crate::onnx::tensor_proto::DataType as D;
    let to = int_attr(node, "to").ok_or("a Cast without `to`")?;
    let to = D::try_from(to as i32).map_err(|_| format!("a Cast to type {to}"))?;
    let float = matches!(to, D::Float | D::Double | D::Float16 | D::Bfloat16);
    let data = match (&x.data, float) {
        (FoldedData::Ints(v), true) => FoldedData::Floats(
            v.iter()
                .map(|d| {
                    signed(d)
                        .map(|n| n as f64)
                        .ok_or("a symbolic size cast to a float")
                })
                .collect::<Result<_, _>>()?,
        ),
        (FoldedData::Floats(v), false) => {
            FoldedData::Ints(v.iter().map(|&f| int(f.trunc() as i64)).collect())
        }
        (data, _) => data.clone(),
    };
    Ok(Folded {
        dims: x.dims.clone(),
        data,
    })
}

/// Elementwise arithmetic of import-time values, one side a single value or both the
/// same length: sizes add and multiply symbolically; subtraction and division need
/// literals.
fn arithmetic(op: &str, a: &Folded, b: &Folded) -> Result<Folded, String> {
    let (n, dims) = if a.len() >= b.len() {
        (a.len(), a.dims.clone())
    } else {
        (b.len(), b.dims.clone())
    };
    if !(a.len() == n || a.len() == 1) || !(b.len() == n || b.len() == 1) {
        return Err(format!(
            "{op} of import-time values of {} and {} elements",
            a.len(),
            b.len()
        ));
    }
    let at = |len: usize, i: usize| if len == 1 { 0 } else { i };
    let data = match (&a.data, &b.data) {
        (FoldedData::Ints(x), FoldedData::Ints(y)) => FoldedData::Ints(
            (0..n)
                .map(|i| integer_op(op, &x[at(x.len(), i)], &y[at(y.len(), i)]))
                .collect::<Result<_, String>>()?,
        ),
        (FoldedData::Floats(x), FoldedData::Floats(y)) => FoldedData::Floats(
            (0..n)
                .map(|i| {
                    let (p, q) = (x[at(x.len(), i)], y[at(y.len(), i)]);
                    match op {
                        "Add" => p + q,
                        "Sub" => p - q,
                        "Mul" => p * q,
                        "Mod" => p % q,
                        "Pow" => p.powf(q),
                        _ => p / q,
                    }
                })
                .collect(),
        ),
        _ => return Err(format!("{op} of import-time values of different types")),
    };
    Ok(Folded { dims, data })
}

/// One integer op: exact on literals (overflow is an error), symbolic sums and
/// products of sizes where one side is a size (`2*BATCH`); nothing else.
fn integer_op(op: &str, p: &SDim, q: &SDim) -> Result<SDim, String> {
    let no = || format!("{op} of sizes {p} and {q}");
    match (signed(p), signed(q)) {
        (Some(a), Some(b)) => {
            let r = match op {
                "Add" => a.checked_add(b),
                "Sub" => a.checked_sub(b),
                "Mul" => a.checked_mul(b),
                // ONNX's integer Mod takes the divisor's sign (`fmod = 0`), as rem_euclid
                // does for a positive divisor.
                "Mod" if b > 0 => Some(a.rem_euclid(b)),
                "Pow" => u32::try_from(b).ok().and_then(|e| a.checked_pow(e)),
                "Div" if b != 0 => Some(a.div_euclid(b)),
                _ => None,
            };
            r.map(int).ok_or_else(no)
        }
        // A size and a small non-negative literal (or two sizes): a polynomial.
        (a, b)
            if a.is_none_or(|v| (0..1 << 32).contains(&v))
                && b.is_none_or(|v| (0..1 << 32).contains(&v)) =>
        {
            match op {
                "Add" => Ok(p.add(q)),
                "Mul" => Ok(p.mul(q)),
                _ => Err(no()),
            }
        }
        _ => Err(no()),
    }
}

/// `Slice` of a rank-1 import-time value by literal `starts`, `ends`, `axes`, `steps`.
fn slice(x: &Folded, rest: &[Option<&Folded>]) -> Result<Folded, String> {
    let lit = |i: usize| -> Result<Option<i64>, String> {
        match rest.get(i).copied().flatten() {
            None => Ok(None),
            Some(f) => {
                let v = f.ints().ok_or("non-integer slice bounds")?;
                match v {
                    [d] => Ok(Some(signed(d).ok_or("symbolic slice bounds")?)),
                    _ => Err("a Slice over several axes of an import-time value".into()),
                }
            }
        }
    };
    if x.dims.len() != 1 {
        return Err("a Slice of an import-time value of rank over 1".into());
    }
    let n = x.dims[0] as i64;
    let (start, end, step) = (
        lit(0)?.unwrap_or(0),
        lit(1)?.unwrap_or(n),
        lit(3)?.unwrap_or(1),
    );
    if step != 1 {
        return Err("a strided Slice of an import-time value".into());
    }
    let clamp = |v: i64| (if v < 0 { v + n } else { v }).clamp(0, n) as usize;
    let (s, e) = (clamp(start), clamp(end).max(clamp(start)));
    let data = match &x.data {
        FoldedData::Ints(v) => FoldedData::Ints(v[s..e].to_vec()),
        FoldedData::Floats(v) => FoldedData::Floats(v[s..e].to_vec()),
        FoldedData::Bools(v) => FoldedData::Bools(v[s..e].to_vec()),
    };
    Ok(Folded {
        dims: vec![e - s],
        data,
    })
}

/// `Reshape` of an import-time value to literal dims (`0` copies a dim, one `-1` is
/// solved).
fn reshape(x: &Folded, shape: &Folded) -> Result<Folded, String> {
    let target = shape.ints().ok_or("a Reshape to non-integer dims")?;
    let mut dims = Vec::with_capacity(target.len());
    let mut open = None;
    for (i, d) in target.iter().enumerate() {
        match signed(d).ok_or("a Reshape of an import-time value to symbolic dims")? {
            0 => dims.push(
                *x.dims
                    .get(i)
                    .ok_or("a Reshape copying a dim the value lacks")?,
            ),
            -1 if open.is_none() => {
                open = Some(i);
                dims.push(1);
            }
            n if n > 0 => dims.push(n as usize),
            n => return Err(format!("a Reshape to a dim of {n}")),
        }
    }
    let known: usize = dims.iter().product();
    if let Some(i) = open {
        if known == 0 || !x.len().is_multiple_of(known) {
            return Err("a Reshape whose open dim is not whole".into());
        }
        dims[i] = x.len() / known;
    }
    if dims.iter().product::<usize>() != x.len() {
        return Err(format!("a Reshape of {} values to {dims:?}", x.len()));
    }
    Ok(Folded {
        dims,
        data: x.data.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(op: &str, attributes: &[(&str, Attribute)]) -> Node {
        Node {
            name: format!("/{op}"),
            op: op.into(),
            inputs: vec![],
            outputs: vec![],
            attributes: attributes
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn ints(v: &[i64]) -> Folded {
        Folded::sizes(v.iter().map(|&x| int(x)).collect())
    }

    #[test]
    fn a_shape_subgraph_folds_to_symbolic_sizes() {
        // x: [BATCH, SEQUENCE, 16] → Shape → Gather(0), Gather(1) → Unsqueeze → Concat
        // with [2, 8]: the reshape target [BATCH, SEQUENCE, 2, 8].
        let dims = vec![SDim::param("BATCH"), SDim::param("SEQUENCE"), SDim::lit(16)];
        let none: &dyn Fn(usize) -> Option<Vec<SDim>> = &|_| None;
        let shape = fold(&node("Shape", &[]), &[None], &|_| Some(dims.clone()))
            .unwrap()
            .unwrap();
        assert_eq!(shape.ints().unwrap(), dims.as_slice());
        let scalar = |i: i64| Folded {
            dims: vec![],
            data: FoldedData::Ints(vec![int(i)]),
        };
        let pick = |i| {
            fold(
                &node("Gather", &[]),
                &[Some(&shape), Some(&scalar(i))],
                none,
            )
            .unwrap()
            .unwrap()
        };
        let (b, t) = (pick(0), pick(-2));
        assert_eq!(b.dims, Vec::<usize>::new());
        let unsqueeze = |x: &Folded| {
            fold(&node("Unsqueeze", &[]), &[Some(x), Some(&ints(&[0]))], none)
                .unwrap()
                .unwrap()
        };
        let (b, t) = (unsqueeze(&b), unsqueeze(&t));
        let target = fold(
            &node("Concat", &[("axis", Attribute::Int(0))]),
            &[Some(&b), Some(&t), Some(&ints(&[2, 8]))],
            none,
        )
        .unwrap()
        .unwrap();
        assert_eq!(target.dims, [4]);
        assert_eq!(
            target.ints().unwrap(),
            [
                SDim::param("BATCH"),
                SDim::param("SEQUENCE"),
                SDim::lit(2),
                SDim::lit(8)
            ]
        );
        // Sizes multiply symbolically; dividing a symbolic size is refused.
        let doubled = fold(&node("Mul", &[]), &[Some(&b), Some(&ints(&[2]))], none)
            .unwrap()
            .unwrap();
        assert_eq!(
            doubled.ints().unwrap(),
            [SDim::param("BATCH").mul(&SDim::lit(2))]
        );
        let e = fold(&node("Div", &[]), &[Some(&b), Some(&ints(&[2]))], none)
            .unwrap()
            .unwrap_err();
        assert!(e.contains("Div of sizes"), "{e}");
    }

    #[test]
    fn literal_arithmetic_is_exact_and_checked() {
        let none: &dyn Fn(usize) -> Option<Vec<SDim>> = &|_| None;
        let op = |o: &str, a: &[i64], b: &[i64]| {
            fold(&node(o, &[]), &[Some(&ints(a)), Some(&ints(b))], none).unwrap()
        };
        assert_eq!(op("Sub", &[5], &[7]).unwrap().ints().unwrap(), [int(-2)]);
        assert_eq!(op("Mod", &[-7], &[3]).unwrap().ints().unwrap(), [int(2)]);
        assert_eq!(
            op("Div", &[16, 9], &[2]).unwrap().ints().unwrap(),
            [int(8), int(4)]
        );
        assert!(
            op("Mul", &[i64::MAX], &[2]).is_err(),
            "overflow is an error"
        );
        assert!(
            op("Div", &[1], &[0]).is_err(),
            "division by zero is an error"
        );
        assert!(
            op("Add", &[1, 2, 3], &[1, 2]).is_err(),
            "lengths must agree"
        );
    }
}
