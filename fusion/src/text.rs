//! The text form of a plan: one line per node, kernel, slot and run-time size. The
//! `#[model]` macro embeds it in the code it generates (a plan is data, decided at
//! build time); it is also what the plan snapshot tests pin.

use crate::plan::{Kernel, KernelKind, Plan};
use crate::sym::SDim;
use kiln_tensor::ir::{Graph, KeptGuard, Node, NodeKind};
use kiln_tensor::{
    AttentionDropout, AttentionInput, AttentionSpec, BinaryOp, CmpOp, DType, Error, Guard, Op,
    RandDist, ReduceOp, Result, TensorMeta, UnaryOp, Window2d,
};

fn dims(d: &[SDim]) -> String {
    let v: Vec<String> = d.iter().map(|x| x.to_text()).collect();
    format!("[{}]", v.join(";"))
}

fn list(v: &[usize]) -> String {
    let s: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    // `;`, because op parameters are separated by `,`.
    format!("[{}]", s.join(";"))
}

fn pair(v: [usize; 2]) -> String {
    format!("{}x{}", v[0], v[1])
}

fn window(w: &Window2d) -> String {
    format!(
        "k={},s={},p={},d={}",
        pair(w.kernel),
        pair(w.stride),
        pair(w.padding),
        pair(w.dilation)
    )
}

/// An op as text: its name, then its parameters in braces.
pub fn op_text(op: &Op<SDim>) -> String {
    let name = op.name();
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::MatMul | Op::MatMulInt8 => {
            name.to_string()
        }
        Op::Reduce { axes, .. } => format!("{name}{{axes={}}}", list(axes)),
        Op::Reshape { dims: d } | Op::Expand { dims: d } => format!("{name}{{dims={}}}", dims(d)),
        Op::Permute { perm } => format!("{name}{{perm={}}}", list(perm)),
        Op::Slice {
            axis,
            start,
            end,
            step,
        } => format!("{name}{{axis={axis},start={start},end={end},step={step}}}"),
        Op::Concat { axis } | Op::Gather { axis } => format!("{name}{{axis={axis}}}"),
        Op::Pad {
            axis,
            before,
            after,
            value,
        } => format!("{name}{{axis={axis},before={before},after={after},value={value:?}}}"),
        Op::ScatterAdd { axis, dims: d } | Op::Iota { axis, dims: d } => {
            format!("{name}{{axis={axis},dims={}}}", dims(d))
        }
        Op::Cast { dtype } => format!("{name}{{dtype={dtype}}}"),
        Op::Attention(spec) | Op::AttentionLse(spec) => format!("{name}{{{}}}", attention(spec)),
        Op::AttentionGrad { spec, wrt } => {
            format!("{name}{{wrt={},{}}}", wrt.name(), attention(spec))
        }
        Op::Unfold2d(w) => format!("{name}{{{}}}", window(w)),
        Op::Fold2d {
            window: w,
            height,
            width,
        } => format!(
            "{name}{{{},h={},w={}}}",
            window(w),
            height.to_text(),
            width.to_text()
        ),
        Op::Full {
            dims: d,
            value,
            dtype,
        } => format!("{name}{{dims={},value={value:?},dtype={dtype}}}", dims(d)),
        Op::Rand {
            dims: d,
            dist,
            seed,
            dtype,
        } => {
            let dist = match dist {
                RandDist::Uniform { low, high } => format!("uniform:{low:?}:{high:?}"),
                RandDist::Normal { mean, std } => format!("normal:{mean:?}:{std:?}"),
            };
            format!(
                "{name}{{dims={},dist={dist},seed={seed},dtype={dtype}}}",
                dims(d)
            )
        }
    }
}

fn bad(what: &str) -> Error {
    Error::Format(format!("malformed plan text: {what}"))
}

fn parse_dims(s: &str) -> Result<Vec<SDim>> {
    let inner = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .ok_or_else(|| bad(s))?;
    if inner.is_empty() {
        return Ok(vec![]);
    }
    inner.split(';').map(SDim::parse).collect()
}

fn parse_list(s: &str) -> Result<Vec<usize>> {
    let inner = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .ok_or_else(|| bad(s))?;
    if inner.is_empty() {
        return Ok(vec![]);
    }
    inner
        .split(';')
        .map(|x| x.parse().map_err(|_| bad(x)))
        .collect()
}

fn parse_pair(s: &str) -> Result<[usize; 2]> {
    let (a, b) = s.split_once('x').ok_or_else(|| bad(s))?;
    Ok([
        a.parse().map_err(|_| bad(s))?,
        b.parse().map_err(|_| bad(s))?,
    ])
}

/// An attention's settings as `op_text` writes them: `scale=..,causal=..` and, with
/// dropout, `,dropout=p:seed`.
fn attention(spec: &AttentionSpec) -> String {
    let mut text = format!("scale={:?},causal={}", spec.scale, spec.causal);
    if let Some(d) = spec.dropout {
        text += &format!(",dropout={:?}:{}", d.p, d.seed);
    }
    text
}

fn parse_dtype(s: &str) -> Result<DType> {
    DType::ALL
        .iter()
        .copied()
        .find(|d| d.name() == s)
        .ok_or_else(|| bad(s))
}

fn num<T: std::str::FromStr>(s: &str) -> Result<T> {
    s.parse().map_err(|_| bad(s))
}

/// Parses `op_text`'s form.
pub fn parse_op(s: &str) -> Result<Op<SDim>> {
    let (name, params) = match s.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}').ok_or_else(|| bad(s))?),
        None => (s, ""),
    };
    let mut kv = std::collections::HashMap::new();
    if !params.is_empty() {
        for part in params.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(|| bad(part))?;
            kv.insert(k, v);
        }
    }
    let get = |k: &str| {
        kv.get(k)
            .copied()
            .ok_or_else(|| bad(&format!("`{name}` lacks `{k}`")))
    };
    let win = || -> Result<Window2d> {
        Ok(Window2d {
            kernel: parse_pair(get("k")?)?,
            stride: parse_pair(get("s")?)?,
            padding: parse_pair(get("p")?)?,
            dilation: parse_pair(get("d")?)?,
        })
    };
    let spec = || -> Result<AttentionSpec> {
        let dropout = match kv.get("dropout") {
            None => None,
            Some(d) => {
                let (p, seed) = d.split_once(':').ok_or_else(|| bad(d))?;
                Some(AttentionDropout {
                    p: num(p)?,
                    seed: num(seed)?,
                })
            }
        };
        Ok(AttentionSpec {
            scale: num(get("scale")?)?,
            causal: num(get("causal")?)?,
            dropout,
        })
    };
    if let Some(u) = UnaryOp::ALL.iter().find(|u| u.name() == name) {
        return Ok(Op::Unary(*u));
    }
    if let Some(b) = BinaryOp::ALL.iter().find(|b| b.name() == name) {
        return Ok(Op::Binary(*b));
    }
    if let Some(c) = CmpOp::ALL.iter().find(|c| c.name() == name) {
        return Ok(Op::Compare(*c));
    }
    if let Some(r) = ReduceOp::ALL.iter().find(|r| r.name() == name) {
        return Ok(Op::Reduce {
            op: *r,
            axes: parse_list(get("axes")?)?,
        });
    }
    Ok(match name {
        "where" => Op::Where,
        "matmul" => Op::MatMul,
        "matmul_int8" => Op::MatMulInt8,
        "reshape" => Op::Reshape {
            dims: parse_dims(get("dims")?)?,
        },
        "expand" => Op::Expand {
            dims: parse_dims(get("dims")?)?,
        },
        "permute" => Op::Permute {
            perm: parse_list(get("perm")?)?,
        },
        "slice" => Op::Slice {
            axis: num(get("axis")?)?,
            start: num(get("start")?)?,
            end: num(get("end")?)?,
            step: num(get("step")?)?,
        },
        "concat" => Op::Concat {
            axis: num(get("axis")?)?,
        },
        "gather" => Op::Gather {
            axis: num(get("axis")?)?,
        },
        "pad" => Op::Pad {
            axis: num(get("axis")?)?,
            before: num(get("before")?)?,
            after: num(get("after")?)?,
            value: num(get("value")?)?,
        },
        "scatter_add" => Op::ScatterAdd {
            axis: num(get("axis")?)?,
            dims: parse_dims(get("dims")?)?,
        },
        "cast" => Op::Cast {
            dtype: parse_dtype(get("dtype")?)?,
        },
        "attention" => Op::Attention(spec()?),
        "attention_lse" => Op::AttentionLse(spec()?),
        "attention_grad" => {
            let wrt = get("wrt")?;
            Op::AttentionGrad {
                spec: spec()?,
                wrt: *AttentionInput::ALL
                    .iter()
                    .find(|w| w.name() == wrt)
                    .ok_or_else(|| bad(wrt))?,
            }
        }
        "unfold2d" => Op::Unfold2d(win()?),
        "fold2d" => Op::Fold2d {
            window: win()?,
            height: SDim::parse(get("h")?)?,
            width: SDim::parse(get("w")?)?,
        },
        "full" => Op::Full {
            dims: parse_dims(get("dims")?)?,
            value: num(get("value")?)?,
            dtype: parse_dtype(get("dtype")?)?,
        },
        "iota" => Op::Iota {
            dims: parse_dims(get("dims")?)?,
            axis: num(get("axis")?)?,
        },
        "rand" => {
            let d = get("dist")?;
            let mut it = d.split(':');
            let (kind, a, b) = (
                it.next().unwrap_or(""),
                num(it.next().unwrap_or(""))?,
                num(it.next().unwrap_or(""))?,
            );
            let dist = match kind {
                "uniform" => RandDist::Uniform { low: a, high: b },
                "normal" => RandDist::Normal { mean: a, std: b },
                _ => return Err(bad(d)),
            };
            Op::Rand {
                dims: parse_dims(get("dims")?)?,
                dist,
                seed: num(get("seed")?)?,
                dtype: parse_dtype(get("dtype")?)?,
            }
        }
        _ => return Err(bad(&format!("unknown op `{name}`"))),
    })
}

impl Plan<SDim> {
    /// The plan as text (`parse` reads it back).
    pub fn to_text(&self) -> String {
        let mut out = String::from("kiln-plan 1\n");
        for (i, n) in self.graph.nodes.iter().enumerate() {
            let what = match &n.kind {
                NodeKind::Leaf(k) => format!("leaf {k}"),
                NodeKind::RecipDim(d) => format!("recip_dim {}", d.to_text()),
                NodeKind::Op(op) => format!("op {}", op_text(op)),
                NodeKind::Call(k) => format!("call {k}"),
                NodeKind::CallGrad(k) => format!("call_grad {k}"),
            };
            out += &format!(
                "node {i} {what} in={} {} {}\n",
                list(&n.inputs),
                n.meta.dtype,
                dims(&n.meta.dims)
            );
        }
        out += &format!(
            "inputs {}\noutputs {}\n",
            list(&self.inputs),
            list(&self.outputs)
        );
        for k in &self.kernels {
            let main = k.main.map_or("-".to_string(), |m| m.to_string());
            out += &format!(
                "kernel {} main={main} nodes={} in={} out={}{}\n",
                k.kind.name(),
                list(&k.nodes),
                list(&k.inputs),
                list(&k.outputs),
                k.row_pass.map_or(String::new(), |p| format!(" rows={p}"))
            );
        }
        for (i, s) in self.slot_of.iter().enumerate() {
            if let Some(s) = s {
                out += &format!("slot node={i} slot={s}\n");
            }
        }
        let slots: Vec<String> = self.slots.iter().map(|d| d.name().to_string()).collect();
        out += &format!("slots [{}]\n", slots.join(","));
        for (a, n, ax) in &self.atoms {
            out += &format!("atom {a} node={n} axis={ax}\n");
        }
        for k in &self.graph.guards {
            out += &format!(
                "guard at={} in={} {}\n",
                k.at,
                list(&k.inputs),
                k.guard.to_text()
            );
        }
        for (i, name) in self.names.iter().enumerate() {
            if let Some(name) = name {
                out += &format!("name node={i} {name}\n");
            }
        }
        // Runs of nodes in one layer, `layer nodes=first..end key`.
        let mut i = 0;
        while i < self.layers.len() {
            let Some(key) = &self.layers[i] else {
                i += 1;
                continue;
            };
            let end = (i..self.layers.len())
                .find(|&j| self.layers[j].as_ref() != Some(key))
                .unwrap_or(self.layers.len());
            out += &format!("layer nodes={i}..{end} {key}\n");
            i = end;
        }
        out
    }

    /// Reads `to_text`'s form.
    pub fn parse(text: &str) -> Result<Self> {
        let mut lines = text.lines();
        if lines.next() != Some("kiln-plan 1") {
            return Err(bad("missing the `kiln-plan 1` header"));
        }
        let mut plan = Plan {
            graph: Graph::new(),
            inputs: vec![],
            outputs: vec![],
            kernels: vec![],
            slot_of: vec![],
            slots: vec![],
            atoms: vec![],
            names: vec![],
            layers: vec![],
        };
        for (no, line) in lines.enumerate() {
            Self::parse_line(&mut plan, line)
                .map_err(|e| bad(&format!("line {}: `{line}`: {e}", no + 2)))?;
        }
        plan.slot_of.resize(plan.graph.nodes.len(), None);
        plan.names.resize(plan.graph.nodes.len(), None);
        plan.layers.resize(plan.graph.nodes.len(), None);
        Ok(plan)
    }

    fn parse_line(plan: &mut Plan<SDim>, line: &str) -> Result<()> {
        {
            let (head, rest) = line.split_once(' ').ok_or_else(|| bad(line))?;
            let field = |name: &str| -> Result<&str> {
                rest.split(' ')
                    .find_map(|w| w.strip_prefix(name).and_then(|x| x.strip_prefix('=')))
                    .ok_or_else(|| bad(line))
            };
            match head {
                "node" => {
                    let words: Vec<&str> = rest.split(' ').collect();
                    if words.len() < 5 {
                        return Err(bad(line));
                    }
                    let kind = match words[1] {
                        "leaf" => NodeKind::Leaf(num(words[2])?),
                        "recip_dim" => NodeKind::RecipDim(SDim::parse(words[2])?),
                        "op" => NodeKind::Op(parse_op(words[2])?),
                        "call" => NodeKind::Call(num(words[2])?),
                        "call_grad" => NodeKind::CallGrad(num(words[2])?),
                        _ => return Err(bad(line)),
                    };
                    let n = words.len();
                    let inputs =
                        parse_list(words[n - 3].strip_prefix("in=").ok_or_else(|| bad(line))?)?;
                    let meta =
                        TensorMeta::new(parse_dims(words[n - 1])?, parse_dtype(words[n - 2])?);
                    plan.graph.nodes.push(Node { kind, inputs, meta });
                }
                "inputs" => plan.inputs = parse_list(rest)?,
                "outputs" => plan.outputs = parse_list(rest)?,
                "kernel" => {
                    let kind_name = rest.split(' ').next().unwrap_or("");
                    let kind = KernelKind::from_name(kind_name).ok_or_else(|| bad(line))?;
                    let main = match field("main")? {
                        "-" => None,
                        m => Some(num(m)?),
                    };
                    plan.kernels.push(Kernel {
                        kind,
                        main,
                        nodes: parse_list(field("nodes")?)?,
                        inputs: parse_list(field("in")?)?,
                        outputs: parse_list(field("out")?)?,
                        row_pass: match field("rows") {
                            Ok(p) => Some(num(p)?),
                            Err(_) => None,
                        },
                    });
                }
                "slot" => {
                    let (n, s): (usize, usize) = (num(field("node")?)?, num(field("slot")?)?);
                    if plan.slot_of.len() <= n {
                        plan.slot_of.resize(n + 1, None);
                    }
                    plan.slot_of[n] = Some(s);
                }
                "slots" => {
                    let inner = rest
                        .strip_prefix('[')
                        .and_then(|x| x.strip_suffix(']'))
                        .ok_or_else(|| bad(line))?;
                    plan.slots = if inner.is_empty() {
                        vec![]
                    } else {
                        inner.split(',').map(parse_dtype).collect::<Result<_>>()?
                    };
                }
                "layer" => {
                    let (first, end) = field("nodes")?.split_once("..").ok_or_else(|| bad(line))?;
                    let (first, end): (usize, usize) = (num(first)?, num(end)?);
                    let key = rest.split_once(' ').map(|x| x.1).ok_or_else(|| bad(line))?;
                    if first >= end || end > plan.graph.nodes.len() {
                        return Err(bad(line));
                    }
                    plan.layers.resize(plan.graph.nodes.len(), None);
                    for layer in &mut plan.layers[first..end] {
                        *layer = Some(key.to_string());
                    }
                }
                "name" => {
                    let n: usize = num(field("node")?)?;
                    let name = rest.split_once(' ').map(|x| x.1).ok_or_else(|| bad(line))?;
                    if plan.names.len() <= n {
                        plan.names.resize(n + 1, None);
                    }
                    plan.names[n] = Some(name.to_string());
                }
                "guard" => {
                    // The check's own text (which may hold spaces) follows the fields.
                    let mut words = rest.splitn(3, ' ');
                    let (_, _, check) = (words.next(), words.next(), words.next());
                    plan.graph.guards.push(KeptGuard {
                        at: num(field("at")?)?,
                        inputs: parse_list(field("in")?)?,
                        guard: Guard::parse(check.ok_or_else(|| bad(line))?)?,
                    });
                }
                "atom" => {
                    let id = num(rest.split(' ').next().unwrap_or(""))?;
                    plan.atoms
                        .push((id, num(field("node")?)?, num(field("axis")?)?));
                }
                _ => return Err(bad(line)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_ops_read_back_as_written() {
        let dropped = AttentionSpec {
            dropout: Some(AttentionDropout {
                p: 0.1f32 as f64,
                seed: u64::MAX,
            }),
            ..AttentionSpec::new(-0.125, true)
        };
        for spec in [AttentionSpec::new(0.5, false), dropped] {
            let ops = [
                Op::Attention(spec),
                Op::AttentionLse(spec),
                Op::AttentionGrad {
                    spec,
                    wrt: AttentionInput::Value,
                },
            ];
            for op in ops {
                let text = op_text(&op);
                assert_eq!(parse_op(&text).unwrap(), op, "{text}");
            }
        }
        assert!(parse_op("attention{scale=1.0,causal=false,dropout=0.5}").is_err());
    }
}
