//! An ONNX graph as Kiln `#[model]` source: layers recognised where the graph has them
//! (`Gemm`, or `MatMul` then `Add` of a bias, over initializers: a `Linear`), the
//! forward pass as statements over them, and the layers' tensors in Kiln's checkpoint
//! names and layout (PyTorch's: `fc1.weight` as `[out, in]`).
//!
//! The ops translated so far are an MLP's: `Gemm`, `MatMul` + `Add`, `Relu`,
//! `Sigmoid`, `Tanh`, `Identity` and a `Flatten` that changes nothing. Any other op is
//! one [`ImportError::Unsupported`] naming every such node.

use crate::error::{ImportError, Result, UnsupportedNode};
use crate::model::{Attribute, Dim, Graph, Node, Tensor, TensorData};
use std::collections::{HashMap, HashSet};

/// A translated model: its source and its checkpoint's tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    /// The `#[model]` struct's name.
    pub name: String,
    /// Rust source: the struct and its `forward`, for a file of its own or `include!`.
    pub source: String,
    /// The checkpoint's tensors, by Kiln's names, in Kiln's layout.
    pub tensors: Vec<(String, Tensor)>,
}

/// One size of a tensor type in the source: a literal or a `const` parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Size {
    Fixed(usize),
    Param(String),
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Size::Fixed(n) => write!(f, "{n}"),
            Size::Param(p) => f.write_str(p),
        }
    }
}

/// A value of the forward pass: the expression computing it and its sizes.
#[derive(Clone, Debug)]
struct Expr {
    /// Source of the value: an identifier or a method-call chain.
    code: String,
    /// Whether `code` is a plain identifier.
    plain: bool,
    /// A name for a `let` binding it (the layer it came from).
    hint: String,
    /// Its sizes.
    sizes: Vec<Size>,
}

/// Translates `graph` into a `#[model]` struct named `name` (an identifier; from the
/// file's stem by [`model_name`]) and its checkpoint, `file` naming the source in
/// the generated header.
pub fn translate(graph: &Graph, name: &str, file: &str) -> Result<Translation> {
    let untranslated = unsupported_nodes(graph);
    if !untranslated.is_empty() {
        return Err(ImportError::Unsupported(untranslated, graph.opset));
    }
    let [input] = graph.inputs.as_slice() else {
        return Err(ImportError::Feature(format!(
            "{} graph inputs (the models translated so far take one)",
            graph.inputs.len()
        )));
    };
    let [output] = graph.outputs.as_slice() else {
        return Err(ImportError::Feature(format!(
            "{} graph outputs (the models translated so far give one)",
            graph.outputs.len()
        )));
    };
    let mut params = Vec::new();
    let input_sizes = input_sizes(input.name.as_str(), input.dims.as_deref(), &mut params)?;
    let readers = readers(graph);
    let arg = identifier(&input.name, "input");
    let mut values: HashMap<&str, Expr> = HashMap::new();
    values.insert(
        input.name.as_str(),
        Expr {
            code: arg.clone(),
            plain: true,
            hint: arg.clone(),
            sizes: input_sizes.clone(),
        },
    );
    let mut fields: Vec<(String, String)> = Vec::new();
    // Fields and locals are separate namespaces (`self.fc1` and `fc1`).
    let mut field_names: HashSet<String> = HashSet::new();
    let mut tensors = Vec::new();
    let mut lets: Vec<String> = Vec::new();
    let mut taken: HashSet<String> = HashSet::from([arg.clone(), "self".to_string()]);
    // A MatMul whose only reader adds a bias becomes the Linear at that Add.
    let mut pending_matmul: HashMap<&str, (&Node, Expr)> = HashMap::new();
    for node in &graph.nodes {
        let get = |v: &str, values: &HashMap<&str, Expr>| {
            values.get(v).cloned().ok_or_else(|| {
                ImportError::Invalid(format!(
                    "node `{}` reads `{v}` before it is computed",
                    node.name
                ))
            })
        };
        let out = node.outputs.first().map(String::as_str).unwrap_or("");
        let result = match node.op.as_str() {
            "Relu" | "Sigmoid" | "Tanh" => {
                let x = get(&node.inputs[0], &values)?;
                Expr {
                    code: format!("{}.{}()", x.code, node.op.to_lowercase()),
                    plain: false,
                    ..x
                }
            }
            "Identity" => get(&node.inputs[0], &values)?,
            "Flatten" => {
                let x = get(&node.inputs[0], &values)?;
                let axis = int_attr(node, "axis", 1)?;
                if x.sizes.len() != 2 || axis != 1 {
                    return Err(unsupported(node, "a Flatten that reshapes (only a no-op Flatten of a rank-2 value is translated so far)", graph.opset));
                }
                x
            }
            "Gemm" => {
                let x = get(&node.inputs[0], &values)?;
                let linear = gemm_linear(graph, node)?;
                apply_linear(
                    node,
                    linear,
                    x,
                    (&mut fields, &mut field_names),
                    &mut tensors,
                    (&mut lets, &mut taken),
                    graph.opset,
                )?
            }
            "MatMul" => {
                let x = get(&node.inputs[0], &values)?;
                let adds_bias = readers
                    .get(out)
                    .map(Vec::as_slice)
                    .is_some_and(|r| matches!(r, [add] if add.op == "Add"));
                if !adds_bias || !graph.initializers.contains_key(&node.inputs[1]) {
                    return Err(unsupported(node, "a MatMul that is not a layer's weight product followed by its bias (only layers are translated so far)", graph.opset));
                }
                pending_matmul.insert(out, (node, x));
                continue;
            }
            "Add" => {
                let (matmul, bias) =
                    match (
                        pending_matmul.remove(node.inputs[0].as_str()),
                        pending_matmul.remove(node.inputs[1].as_str()),
                    ) {
                        (Some(m), None) => (m, &node.inputs[1]),
                        (None, Some(m)) => (m, &node.inputs[0]),
                        _ => return Err(unsupported(
                            node,
                            "an Add that is not a layer's bias (only layers are translated so far)",
                            graph.opset,
                        )),
                    };
                let ((mm, x), bias) = (matmul, bias);
                let linear = matmul_linear(graph, mm, bias)?;
                apply_linear(
                    mm,
                    linear,
                    x,
                    (&mut fields, &mut field_names),
                    &mut tensors,
                    (&mut lets, &mut taken),
                    graph.opset,
                )?
            }
            other => unreachable!("unsupported op {other} passed the check"),
        };
        values.insert(out, result);
    }
    let result = values.get(output.name.as_str()).cloned().ok_or_else(|| {
        ImportError::Invalid(format!("the output `{}` is never computed", output.name))
    })?;
    if let Some(declared) = &output.dims {
        check_declared(&output.name, declared, &result.sizes)?;
    }
    let name = name.to_string();
    let source = source(
        &name,
        file,
        graph,
        &params,
        (&arg, &input_sizes),
        &fields,
        &lets,
        &result,
    );
    Ok(Translation {
        name,
        source,
        tensors,
    })
}

/// The ops translated so far.
const TRANSLATED: &[&str] = &[
    "Gemm", "MatMul", "Add", "Relu", "Sigmoid", "Tanh", "Identity", "Flatten",
];

/// Every node whose op is not translated.
fn unsupported_nodes(graph: &Graph) -> Vec<UnsupportedNode> {
    graph
        .nodes
        .iter()
        .filter(|n| !TRANSLATED.contains(&n.op.as_str()))
        .map(|n| UnsupportedNode {
            node: n.name.clone(),
            op: n.op.clone(),
            why: None,
        })
        .collect()
}

/// One node that cannot be translated, and why.
fn unsupported(node: &Node, why: &str, opset: i64) -> ImportError {
    ImportError::Unsupported(
        vec![UnsupportedNode {
            node: node.name.clone(),
            op: node.op.clone(),
            why: Some(why.to_string()),
        }],
        opset,
    )
}

/// The nodes reading each value.
fn readers(graph: &Graph) -> HashMap<&str, Vec<&Node>> {
    let mut r: HashMap<&str, Vec<&Node>> = HashMap::new();
    for n in &graph.nodes {
        for i in &n.inputs {
            r.entry(i.as_str()).or_default().push(n);
        }
    }
    r
}

/// An integer attribute, `default` where absent.
fn int_attr(node: &Node, name: &str, default: i64) -> Result<i64> {
    match node.attributes.get(name) {
        None => Ok(default),
        Some(Attribute::Int(v)) => Ok(*v),
        Some(other) => Err(ImportError::Invalid(format!(
            "attribute `{name}` of node `{}` ({}) is {other:?}, not an integer",
            node.name, node.op
        ))),
    }
}

/// A float attribute, `default` where absent.
fn float_attr(node: &Node, name: &str, default: f32) -> Result<f32> {
    match node.attributes.get(name) {
        None => Ok(default),
        Some(Attribute::Float(v)) => Ok(*v),
        Some(other) => Err(ImportError::Invalid(format!(
            "attribute `{name}` of node `{}` ({}) is {other:?}, not a float",
            node.name, node.op
        ))),
    }
}

/// A linear layer read from the graph: its weight `[out, in]` and bias `[out]`, and
/// the initializer name its field is named after.
struct LinearLayer {
    weight: Tensor,
    bias: Tensor,
    named_after: String,
}

/// The `Linear` a `Gemm` over initializers is: `y = x·Bᵀ + C` (PyTorch's export,
/// `transB = 1`) or `y = x·B + C`.
fn gemm_linear(graph: &Graph, node: &Node) -> Result<LinearLayer> {
    let why = |what: &str| unsupported(node, what, graph.opset);
    if float_attr(node, "alpha", 1.0)? != 1.0 || float_attr(node, "beta", 1.0)? != 1.0 {
        return Err(why("a Gemm with alpha or beta other than 1"));
    }
    if int_attr(node, "transA", 0)? != 0 {
        return Err(why("a Gemm with its input transposed"));
    }
    let (Some(b), Some(c)) = (
        node.inputs.get(1).and_then(|n| graph.initializers.get(n)),
        node.inputs.get(2).and_then(|n| graph.initializers.get(n)),
    ) else {
        return Err(why("a Gemm whose weight or bias is not an initializer"));
    };
    let weight = match int_attr(node, "transB", 0)? {
        0 => transposed(b).ok_or_else(|| why("a Gemm whose weight is not a matrix of floats"))?,
        _ => b.clone(),
    };
    linear(node, weight, c, &node.inputs[1], graph.opset)
}

/// The `Linear` a `MatMul` by an initializer `[in, out]` and the `Add` of `bias` are.
fn matmul_linear(graph: &Graph, node: &Node, bias: &str) -> Result<LinearLayer> {
    let why = |what: &str| unsupported(node, what, graph.opset);
    let b = &graph.initializers[&node.inputs[1]];
    let c = graph
        .initializers
        .get(bias)
        .ok_or_else(|| why("a MatMul whose added bias is not an initializer"))?;
    let weight =
        transposed(b).ok_or_else(|| why("a MatMul whose weight is not a matrix of floats"))?;
    linear(node, weight, c, &node.inputs[1], graph.opset)
}

/// A linear layer, its weight `[out, in]` checked against its bias.
fn linear(
    node: &Node,
    weight: Tensor,
    bias: &Tensor,
    named_after: &str,
    opset: i64,
) -> Result<LinearLayer> {
    let out = weight.dims[0];
    let bias_dims_fit = bias.dims == [out] || bias.dims == [1, out];
    if !bias_dims_fit || !matches!(bias.data, TensorData::F32(_)) {
        return Err(unsupported(
            node,
            &format!("a layer whose bias {:?} is not {out} floats", bias.dims),
            opset,
        ));
    }
    Ok(LinearLayer {
        weight,
        bias: Tensor {
            dims: vec![out],
            data: bias.data.clone(),
        },
        named_after: named_after.to_string(),
    })
}

/// A float matrix transposed, `None` for anything else.
fn transposed(t: &Tensor) -> Option<Tensor> {
    let (TensorData::F32(v), [rows, cols]) = (&t.data, t.dims.as_slice()) else {
        return None;
    };
    let (rows, cols) = (*rows, *cols);
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    Some(Tensor {
        dims: vec![cols, rows],
        data: TensorData::F32(out),
    })
}

/// `x` through a new `Linear` field: the field declared (`fields` and their names),
/// its tensors kept, `x` bound to a `let` first unless it is a plain identifier
/// (`lets` and the locals' names).
fn apply_linear(
    node: &Node,
    layer: LinearLayer,
    x: Expr,
    (fields, field_names): (&mut Vec<(String, String)>, &mut HashSet<String>),
    tensors: &mut Vec<(String, Tensor)>,
    (lets, taken): (&mut Vec<String>, &mut HashSet<String>),
    opset: i64,
) -> Result<Expr> {
    let (out, inn) = (layer.weight.dims[0], layer.weight.dims[1]);
    if x.sizes.last() != Some(&Size::Fixed(inn)) {
        return Err(unsupported(
            node,
            &format!(
                "a layer of {inn} inputs applied to a value of sizes [{}]",
                x.sizes
                    .iter()
                    .map(Size::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            opset,
        ));
    }
    let field = unique(field_name(&layer.named_after, fields.len()), field_names);
    fields.push((field.clone(), format!("Linear<{inn}, {out}>")));
    tensors.push((format!("{field}.weight"), layer.weight));
    tensors.push((format!("{field}.bias"), layer.bias));
    let arg = if x.plain {
        x.code
    } else {
        let name = unique(x.hint.clone(), taken);
        lets.push(format!("let {name} = {};", x.code));
        name
    };
    let mut sizes = x.sizes;
    *sizes.last_mut().expect("a rank of at least 1") = Size::Fixed(out);
    Ok(Expr {
        code: format!("self.{field}({arg})"),
        plain: false,
        hint: field,
        sizes,
    })
}

/// The field a layer is named after its weight's initializer: `fc1.weight` → `fc1`,
/// `blocks.0.fc.weight` → `blocks_0_fc`; `linear<n>` where the name says nothing
/// (`onnx::MatMul_12`).
fn field_name(initializer: &str, position: usize) -> String {
    let stem = initializer.strip_suffix(".weight").unwrap_or(initializer);
    if stem.contains("::") || stem.starts_with("onnx") || stem.is_empty() {
        return format!("linear{}", position + 1);
    }
    identifier(stem, &format!("linear{}", position + 1))
}

/// `name` as a snake-case Rust identifier (`fallback` where nothing of it is left).
fn identifier(name: &str, fallback: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    while s.contains("__") {
        s = s.replace("__", "_");
    }
    let s = s.trim_matches('_').to_string();
    match s.chars().next() {
        None => fallback.to_string(),
        Some(c) if c.is_ascii_digit() => format!("v{s}"),
        _ if is_keyword(&s) => format!("{s}_"),
        _ => s,
    }
}

/// Whether `s` is a Rust keyword (not usable as a plain identifier).
fn is_keyword(s: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum",
        "extern", "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod",
        "move", "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait",
        "true", "type", "unsafe", "use", "where", "while", "yield",
    ];
    KEYWORDS.contains(&s)
}

/// `name`, or `name_2`, `name_3`… where it is taken; then taken.
fn unique(name: String, taken: &mut HashSet<String>) -> String {
    let mut candidate = name.clone();
    let mut n = 2;
    while taken.contains(&candidate) {
        candidate = format!("{name}_{n}");
        n += 1;
    }
    taken.insert(candidate.clone());
    candidate
}

/// The model name of a file stem: `mlp` → `Mlp`, `resnet-18` → `Resnet18`.
pub fn model_name(stem: &str) -> String {
    let mut out = String::new();
    for part in stem
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| !p.is_empty())
    {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    match out.chars().next() {
        None => "Imported".to_string(),
        Some(c) if c.is_ascii_digit() => format!("Model{out}"),
        _ => out,
    }
}

/// The input's sizes: fixed dims as literals, symbolic ones as `const` parameters
/// (`batch` → `BATCH`, pushed to `params` once each).
fn input_sizes(name: &str, dims: Option<&[Dim]>, params: &mut Vec<String>) -> Result<Vec<Size>> {
    let dims =
        dims.ok_or_else(|| ImportError::Feature(format!("the input `{name}` declares no shape")))?;
    if dims.is_empty() {
        return Err(ImportError::Feature(format!(
            "the input `{name}` is a scalar"
        )));
    }
    Ok(dims
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Dim::Fixed(n) => Size::Fixed(*n),
            Dim::Named(s) => {
                let p = identifier(s, &format!("d{i}")).to_ascii_uppercase();
                if !params.contains(&p) {
                    params.push(p.clone());
                }
                Size::Param(p)
            }
            Dim::Unknown => {
                let p = format!("D{i}");
                params.push(p.clone());
                Size::Param(p)
            }
        })
        .collect())
}

/// The translated sizes of an output checked against its declaration.
fn check_declared(name: &str, declared: &[Dim], sizes: &[Size]) -> Result<()> {
    let fits = declared.len() == sizes.len()
        && declared.iter().zip(sizes).all(|(d, s)| match (d, s) {
            (Dim::Fixed(a), Size::Fixed(b)) => a == b,
            (Dim::Fixed(_), Size::Param(_)) => false,
            _ => true,
        });
    if fits {
        Ok(())
    } else {
        Err(ImportError::Invalid(format!(
            "the output `{name}` is declared {declared:?} but computes [{}]",
            sizes
                .iter()
                .map(Size::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// The generated file.
#[allow(clippy::too_many_arguments)]
fn source(
    name: &str,
    file: &str,
    graph: &Graph,
    params: &[String],
    (arg, input): (&str, &[Size]),
    fields: &[(String, String)],
    lets: &[String],
    result: &Expr,
) -> String {
    let list = |s: &[Size]| s.iter().map(Size::to_string).collect::<Vec<_>>().join(", ");
    let generics = if params.is_empty() {
        String::new()
    } else {
        format!(
            "<{}>",
            params
                .iter()
                .map(|p| format!("const {p}: usize"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let producer = if graph.producer.is_empty() {
        String::new()
    } else {
        format!("{}, ", graph.producer)
    };
    let mut s = format!(
        "// `{name}`, imported from `{file}` ({producer}ONNX opset {}) by kiln-import.\n\nuse kiln::prelude::*;\n\n",
        graph.opset
    );
    s += &format!("/// The model of `{file}`.\n#[model]\npub struct {name} {{\n");
    for (field, ty) in fields {
        s += &format!("    {field}: {ty},\n");
    }
    s += "}\n\n#[model]\n";
    s += &format!("impl {name} {{\n");
    s += &format!(
        "    /// The graph's output `{}` of its input `{}`.\n",
        graph.outputs[0].name, graph.inputs[0].name
    );
    s += &format!(
        "    pub fn forward{generics}(&self, {arg}: Tensor<{}>) -> Tensor<{}> {{\n",
        list(input),
        list(&result.sizes)
    );
    for l in lets {
        s += &format!("        {l}\n");
    }
    s += &format!("        {}\n    }}\n}}\n", result.code);
    s
}
