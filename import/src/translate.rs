//! An ONNX graph as Kiln `#[model]` source: layers recognised where the graph has them
//! (`Gemm`, or `MatMul` then `Add` of a bias, over initializers: a `Linear`; `Conv`,
//! `BatchNormalization`, `MaxPool`, `AveragePool`, `GlobalAveragePool`,
//! `LayerNormalization` or a layer norm written out, a `Gather` of table rows: an
//! `Embedding`), what the graph computes from constants and shapes folded at import
//! time (`fold.rs`), causal masks and positions recognised by their rules, the rest as
//! tensor methods (elementwise ops of Kiln's op table, products, reshapes, slices,
//! transposes, softmax, means, arithmetic), and the layers' tensors in Kiln's
//! checkpoint names and layout (PyTorch's: `fc1.weight` as `[out, in]`).
//!
//! Shapes are not restated here: each layer is a `kiln_tensor::nn::LayerSpec` whose
//! type, parameters and forward pass are the library's, and each method the op IR's,
//! recorded with symbolic dims (`kiln_fusion::SDim`), so a size the generated source
//! names is one the library computed and `#[model]` will check again. Any other op is
//! one [`ImportError::Unsupported`] naming every such node (docs/onnx-import.md lists
//! what is translated).

use crate::error::{ImportError, Result, UnsupportedNode};
use crate::fold::{fold, Folded, FOLDED};
use crate::model::{Attribute, Dim, ElementType, Graph, Node, Tensor, TensorData};
use kiln_fusion::SDim;
use kiln_tensor::ir::{Graph as Ir, NodeId};
use kiln_tensor::nn::spec::BATCH_NORM_EPS;
use kiln_tensor::nn::{LayerSpec, Mode};
use kiln_tensor::{BuilderExt, DType, SymDim, UnaryOp};
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

/// A value of the forward pass: the expression computing it and its node in the IR
/// (which holds its dims).
#[derive(Clone, Debug)]
struct Expr {
    /// Source of the value: an identifier or a method-call chain.
    code: String,
    /// Whether `code` is a plain identifier.
    plain: bool,
    /// Whether `code` is one layer applied (`self.conv1(x)`), which reads well as the
    /// argument of the next layer.
    layer_call: bool,
    /// A name for a `let` binding it (the layer it came from).
    hint: String,
    /// Its node in the shape recording.
    id: NodeId,
}

/// A value of the graph as translation sees it: computed by the generated code, or
/// known at import time (folded).
#[derive(Clone, Debug)]
enum Val {
    /// Computed by the generated code.
    Dyn(Expr),
    /// Known at import time.
    Static(Folded),
    /// The positions `0..n` of a sequence (`Range(0, n, 1)`), for a position table.
    Positions(SDim),
    /// A 0/1 matrix known at import time by its rule (a causal mask's triangle).
    Band(Band),
}

/// A 0/1 matrix `[rows, cols]` of symbolic size, known by its rule: entry `(i, j)` is
/// set where `j - i >= k` (`Some((true, k))`, an upper triangle), `j - i <= k`
/// (`Some((false, k))`, a lower one) or everywhere (`None`), the opposite where
/// `negated`. What `ConstantOfShape`, `Trilu`, `Cast`, `Not` and `Equal` to 0 build a
/// causal mask from.
#[derive(Clone, Debug)]
struct Band {
    dims: [SDim; 2],
    rule: Option<(bool, i64)>,
    negated: bool,
}

impl Band {
    /// Whether the set entries are exactly those above the diagonal (`j > i`): the
    /// keys a causal mask hides from each query.
    fn is_above_diagonal(&self) -> bool {
        matches!(
            (self.rule, self.negated),
            (Some((true, 1)), false) | (Some((false, 0)), true)
        )
    }

    /// The complement.
    fn negated(self) -> Band {
        Band {
            negated: !self.negated,
            ..self
        }
    }
}

/// The longest code a value carries inline before it is bound by a `let`: far past
/// what reads well, so only machine-made chains meet it.
const LONGEST_INLINE_CODE: usize = 400;

/// How translation reads a computed value by name.
type ValueOf<'g> = dyn Fn(&str, &HashMap<&'g str, Val>) -> Result<Expr> + 'g;

/// Initializers this small are folded when an op reads them as values (the constants
/// of shape subgraphs); a layer's weights are read as its tensors instead.
const FOLDED_INITIALIZER: usize = 4096;

/// What translation builds: the struct's fields, the checkpoint, the forward pass's
/// `let`s, and the op IR recording shapes.
struct Translator {
    ir: Ir<SDim>,
    leaves: usize,
    fields: Vec<(String, String)>,
    field_names: Names,
    /// How many layers of each kind (`Linear`) are fields so far.
    kinds: HashMap<String, usize>,
    tensors: Vec<(String, Tensor)>,
    lets: Vec<(String, String)>,
    locals: Names,
    opset: i64,
    /// Each reshape written, by its node: its code, and the code and node it reshapes
    /// (a reshape of a reshape is written as one).
    reshapes: HashMap<NodeId, (String, String, NodeId)>,
}

impl Translator {
    /// A new leaf of the shape recording.
    fn leaf(&mut self, dims: Vec<SDim>, dtype: DType) -> NodeId {
        self.leaves += 1;
        self.ir.leaf(self.leaves, dims, dtype)
    }

    /// The dims of a recorded value.
    fn dims(&self, id: NodeId) -> Vec<SDim> {
        self.ir.dims(&id)
    }

    /// `x` as a layer's argument: itself if an identifier or one layer applied, else
    /// bound by a new `let`.
    fn bind(&mut self, x: &Expr) -> String {
        if x.plain || x.layer_call {
            return x.code.clone();
        }
        let name = self.locals.unique(x.hint.clone());
        self.lets
            .push((name.clone(), without_outer_parens(&x.code).to_string()));
        name
    }

    /// `x` through a new layer field `spec` named after `named_after`, holding
    /// `tensors` (checked against the spec's parameters and buffers, in order).
    fn layer(
        &mut self,
        node: &Node,
        spec: LayerSpec,
        named_after: &str,
        tensors: Vec<(&'static str, Tensor)>,
        x: &Expr,
    ) -> Result<Expr> {
        self.layer_via(node, spec, named_after, tensors, x, None)
    }

    /// [`Translator::layer`], called through the layer's method `via` where given
    /// (`self.pos.positions(ids)`, `x` then recording what the method feeds the layer).
    fn layer_via(
        &mut self,
        node: &Node,
        spec: LayerSpec,
        named_after: &str,
        tensors: Vec<(&'static str, Tensor)>,
        x: &Expr,
        via: Option<&str>,
    ) -> Result<Expr> {
        let x_dims = self.dims(x.id);
        spec.check_input(&x_dims)
            .map_err(|e| unsupported(node, &e, self.opset))?;
        if let Some((name, _)) = tensors
            .iter()
            .find(|(_, t)| !matches!(t.data, TensorData::F32(_)))
        {
            return Err(unsupported(
                node,
                &format!("its {name} is not f32 (Kiln's layers hold f32)"),
                self.opset,
            ));
        }
        let wanted: Vec<_> = spec.params().into_iter().chain(spec.buffers()).collect();
        let fits = wanted.len() == tensors.len()
            && wanted
                .iter()
                .zip(&tensors)
                .all(|(w, (n, t))| w.name == *n && w.dims == t.dims);
        if !fits {
            let held: Vec<String> = tensors
                .iter()
                .map(|(n, t)| format!("{n} {:?}", t.dims))
                .collect();
            return Err(unsupported(
                node,
                &format!("its tensors ({}) are not a {spec}'s", held.join(", ")),
                self.opset,
            ));
        }
        let params: Vec<NodeId> = wanted
            .iter()
            .map(|w| {
                let dims = w.dims.iter().map(|&d| SDim::lit(d)).collect();
                self.leaf(dims, DType::F32)
            })
            .collect();
        let refs: Vec<&NodeId> = params.iter().collect();
        let y = spec
            .forward(&mut self.ir, &refs, &x.id, Mode::Eval)
            .map_err(|e| unsupported(node, &e.to_string(), self.opset))?
            .y;
        let kind = spec.to_string();
        let kind = kind.split('<').next().unwrap_or("layer").to_string();
        let same_kind = self.kinds.get(&kind).copied().unwrap_or(0);
        *self.kinds.entry(kind.clone()).or_default() += 1;
        let named = field_name(named_after, &kind, same_kind);
        let fallback = field_name("", &kind, same_kind);
        // A weight named by the exporter (`onnx::MatMul_12`) says nothing: the node's
        // scope (`/q/MatMul` → `q`) may.
        let named = if named == fallback {
            field_name(&node.name, &kind, same_kind)
        } else {
            named
        };
        let field = self.field_names.unique(named);
        self.fields.push((field.clone(), spec.to_string()));
        for (name, t) in tensors {
            self.tensors.push((format!("{field}.{name}"), t));
        }
        let arg = self.bind(x);
        let call = match via {
            Some(method) => format!("self.{field}.{method}({arg})"),
            None => format!("self.{field}({arg})"),
        };
        Ok(Expr {
            code: call,
            plain: false,
            layer_call: true,
            hint: local_hint(&field),
            id: y,
        })
    }

    /// `x`'s code, bound by a new `let` where it is longer than a chain rustfmt keeps
    /// on one line (an operand of `a + b`).
    fn bind_long(&mut self, x: &Expr) -> String {
        if x.code.len() > 60 && !x.plain {
            self.bind(&Expr {
                layer_call: false,
                ..x.clone()
            })
        } else {
            x.code.clone()
        }
    }

    /// `x.method()` for an elementwise op of Kiln's table.
    fn unary(&mut self, node: &Node, op: UnaryOp, x: &Expr) -> Result<Expr> {
        let id = self
            .ir
            .unary(op, &x.id)
            .map_err(|e| unsupported(node, &e.to_string(), self.opset))?;
        Ok(Expr {
            code: format!("{}.{}()", x.code, op.method()),
            plain: false,
            layer_call: false,
            hint: x.hint.clone(),
            id,
        })
    }
}

/// Translates `graph` into a `#[model]` struct named `name` (an identifier; from the
/// file's stem by [`model_name`]) and its checkpoint, `file` naming the source in
/// the generated header.
pub fn translate(graph: &Graph, name: &str, file: &str) -> Result<Translation> {
    check_model_name(name)?;
    let graph = &with_weights_resolved(graph);
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
    let input_dims = input_dims(input.name.as_str(), input.dims.as_deref(), &mut params)?;
    let readers = readers(graph);
    let arg = identifier(&input.name, "input");
    let mut b = Translator {
        ir: Ir::new(),
        leaves: 0,
        fields: Vec::new(),
        field_names: Names::default(),
        kinds: HashMap::new(),
        tensors: Vec::new(),
        lets: Vec::new(),
        locals: Names::taken([arg.clone(), "self".to_string()]),
        opset: graph.opset,
        reshapes: HashMap::new(),
    };
    // Integer inputs (ONNX's int64 ids) are Kiln's i32.
    let (input_dtype, input_suffix) = match input.dtype {
        None | Some(ElementType::F32) => (DType::F32, ""),
        Some(ElementType::I64 | ElementType::I32) => (DType::I32, ", i32"),
        Some(other) => {
            return Err(ImportError::Feature(format!(
            "the input `{}` is {other:?} (Kiln's imported models take f32 values or integer ids)",
            input.name
        )))
        }
    };
    let input_id = b.leaf(input_dims.clone(), input_dtype);
    let mut values: HashMap<&str, Val> = HashMap::new();
    values.insert(
        input.name.as_str(),
        Val::Dyn(Expr {
            code: arg.clone(),
            plain: true,
            layer_call: false,
            hint: arg.clone(),
            id: input_id,
        }),
    );
    for (name, t) in &graph.initializers {
        if t.data.len() <= FOLDED_INITIALIZER {
            values.insert(name.as_str(), Val::Static(Folded::of(t)));
        }
    }
    // A MatMul whose only reader adds a bias becomes the Linear at that Add.
    let mut pending_matmul: HashMap<&str, (&Node, Expr)> = HashMap::new();
    let (gelus, mut inside) = exact_gelus(graph, &readers);
    let (norms, inside_norms) = written_out_layer_norms(graph, &readers);
    inside.extend(inside_norms);
    // How often the GELUs and layer norms written out read each value (counted once,
    // not per node).
    let mut composite_reads: HashMap<&str, usize> = HashMap::new();
    for x in gelus.values().copied().chain(norms.values().map(|n| n.x)) {
        *composite_reads.entry(x).or_default() += 1;
    }
    for node in &graph.nodes {
        // The exact GELU and the layer norm written out are `x.gelu()` and a
        // `LayerNorm`: their inner nodes write nothing.
        if inside.contains(node.name.as_str()) {
            continue;
        }
        let composite = written_out(node, &norms, &gelus, &values, &mut b, graph)?;
        // Positions and the triangles of causal masks, by their rules.
        if let Some(v) = composite
            .is_none()
            .then(|| pattern(node, &values, graph.opset))
            .flatten()
        {
            let v = v?;
            if let Some(out) = node.outputs.first() {
                values.insert(out.as_str(), v);
            }
            continue;
        }
        // Folded at import time where every input is known (or, for `Shape`, its dims).
        let known: Vec<Option<&Folded>> = node
            .inputs
            .iter()
            .map(|i| match values.get(i.as_str()) {
                Some(Val::Static(f)) => Some(f),
                _ => None,
            })
            .collect();
        let dims_of = |i: usize| match node.inputs.get(i).and_then(|v| values.get(v.as_str())) {
            Some(Val::Dyn(e)) => Some(b.dims(e.id)),
            _ => None,
        };
        if let Some(folded) = composite
            .is_none()
            .then(|| fold(node, &known, &dims_of))
            .flatten()
        {
            let folded = folded.map_err(|why| unsupported(node, &why, graph.opset))?;
            if let Some(out) = node.outputs.first() {
                values.insert(out.as_str(), Val::Static(folded));
            }
            continue;
        }
        let get = |v: &str, values: &HashMap<&str, Val>| {
            match values.get(v) {
            Some(Val::Dyn(e)) => Ok(e.clone()),
            Some(Val::Static(_)) => Err(unsupported(
                node,
                &format!("`{v}` is known at import time, and a computed constant used as a tensor is not translated yet"),
                graph.opset,
            )),
            Some(Val::Positions(_)) => Err(unsupported(
                node,
                &format!("`{v}` is a Range 0..n, which is translated only as the positions a position table embeds"),
                graph.opset,
            )),
            Some(Val::Band(_)) => Err(unsupported(
                node,
                &format!("`{v}` is a triangle of ones, which is translated only as a causal mask chosen by a Where"),
                graph.opset,
            )),
            None => Err(ImportError::Invalid(format!(
                "node `{}` reads `{v}` before it is computed",
                node.name
            ))),
        }
        };
        let why = |what: &str| unsupported(node, what, graph.opset);
        let out = node.outputs.first().map(String::as_str).unwrap_or("");
        let result = match (composite, node.op.as_str()) {
            (Some(e), _) => e,
            (None, op) => match op {
                "Identity" => get(&node.inputs[0], &values)?,
                "Flatten" => {
                    let x = get(&node.inputs[0], &values)?;
                    if int_attr(node, "axis", 1)? != 1 {
                        return Err(why("a Flatten at an axis other than 1"));
                    }
                    if b.dims(x.id).len() == 2 {
                        x
                    } else {
                        let id = b.ir.flatten(&x.id).map_err(|e| why(&e.to_string()))?;
                        Expr {
                            code: format!("{}.flatten()", x.code),
                            plain: false,
                            layer_call: false,
                            id,
                            ..x
                        }
                    }
                }
                "Gemm" => {
                    let x = get(&node.inputs[0], &values)?;
                    let (spec, tensors) = gemm_linear(graph, node)?;
                    b.layer(node, spec, &node.inputs[1], tensors, &x)?
                }
                "MatMul" if pending_matmul_ok(graph, node, &readers, out) => {
                    let x = get(&node.inputs[0], &values)?;
                    pending_matmul.insert(out, (node, x));
                    continue;
                }
                "Add"
                    if node
                        .inputs
                        .iter()
                        .any(|i| pending_matmul.contains_key(i.as_str())) =>
                {
                    let ((mm, x), bias) = match (
                        pending_matmul.remove(node.inputs[0].as_str()),
                        pending_matmul.remove(node.inputs[1].as_str()),
                    ) {
                        (Some(m), None) => (m, &node.inputs[1]),
                        (None, Some(m)) => (m, &node.inputs[0]),
                        _ => return Err(why("an Add of two layers' products")),
                    };
                    let (spec, tensors) = matmul_linear(graph, mm, bias)?;
                    b.layer(mm, spec, &mm.inputs[1], tensors, &x)?
                }
                "Reshape" => {
                    let x = get(&node.inputs[0], &values)?;
                    let Some(Val::Static(shape)) =
                        node.inputs.get(1).and_then(|v| values.get(v.as_str()))
                    else {
                        return Err(why("a Reshape to a shape computed at run time"));
                    };
                    let dims = reshape_target(&b.dims(x.id), shape).map_err(|e| why(&e))?;
                    reshaped(&mut b, node, x, dims)?
                }
                "Unsqueeze" | "Squeeze" => {
                    let x = get(&node.inputs[0], &values)?;
                    let dims = squeezed(node, &b.dims(x.id), &values, graph.opset)?;
                    reshaped(&mut b, node, x, dims)?
                }
                "Slice" => {
                    let x = get(&node.inputs[0], &values)?;
                    sliced(&mut b, node, x, &values)?
                }
                "Gather" if matches!(values.get(node.inputs[0].as_str()), Some(Val::Dyn(_))) => {
                    let x = get(&node.inputs[0], &values)?;
                    picked(&mut b, node, x, &values)?
                }
                "Cast" => {
                    let x = get(&node.inputs[0], &values)?;
                    let to = int_attr(node, "to", 0)?;
                    let dtype =
                        onnx_dtype(to).ok_or_else(|| why(&format!("a Cast to ONNX type {to}")))?;
                    if b.ir.dtype(&x.id) == dtype {
                        x
                    } else {
                        let id = b.ir.cast(&x.id, dtype).map_err(|e| why(&e.to_string()))?;
                        method(x, format!("cast::<{}>()", dtype.name()), id)
                    }
                }
                "Where" => {
                    let scores = causal_mask_of(node, &values, &readers, graph.opset)?;
                    let x = get(scores, &values)?;
                    let dims = b.dims(x.id);
                    let Some(Val::Band(mask)) = values.get(node.inputs[0].as_str()) else {
                        unreachable!("causal_mask_of checked the condition")
                    };
                    if dims.len() < 2 || mask.dims[..] != dims[dims.len() - 2..] {
                        return Err(why(&format!(
                            "a causal mask of [{}] over scores [{}]",
                            list(&mask.dims),
                            list(&dims)
                        )));
                    }
                    let id = b.ir.causal_mask(&x.id).map_err(|e| why(&e.to_string()))?;
                    method(x, "causal_mask()".into(), id)
                }
                "Transpose" => {
                    let x = get(&node.inputs[0], &values)?;
                    let rank = b.dims(x.id).len();
                    let perm: Vec<usize> = match node.attributes.get("perm") {
                        Some(Attribute::Ints(p)) => p.iter().map(|&a| a as usize).collect(),
                        _ => (0..rank).rev().collect(),
                    };
                    let id =
                        b.ir.permute(&x.id, &perm)
                            .map_err(|e| why(&e.to_string()))?;
                    let args = perm
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ");
                    method(x, format!("permute::<{args}>()"), id)
                }
                "Softmax" | "LogSoftmax" => {
                    let x = get(&node.inputs[0], &values)?;
                    let rank = b.dims(x.id).len();
                    let axis = axis_of(node, int_attr(node, "axis", -1)?, rank, graph.opset)?;
                    let (id, name) = if node.op == "Softmax" {
                        (b.ir.softmax(&x.id, axis), "softmax")
                    } else {
                        (b.ir.log_softmax(&x.id, axis), "log_softmax")
                    };
                    let id = id.map_err(|e| why(&e.to_string()))?;
                    let call = if axis + 1 == rank {
                        format!("{name}()")
                    } else {
                        format!("{name}({axis})")
                    };
                    method(x, call, id)
                }
                "Gelu" => {
                    let x = get(&node.inputs[0], &values)?;
                    let (id, call) = match node.attributes.get("approximate") {
                        None => (b.ir.gelu_erf(&x.id), "gelu()"),
                        Some(Attribute::String(a)) if a == "none" => {
                            (b.ir.gelu_erf(&x.id), "gelu()")
                        }
                        Some(Attribute::String(a)) if a == "tanh" => {
                            (b.ir.gelu_tanh(&x.id), "gelu_tanh()")
                        }
                        Some(other) => {
                            return Err(why(&format!("a Gelu approximated by {other:?}")))
                        }
                    };
                    let id = id.map_err(|e| why(&e.to_string()))?;
                    method(x, call.into(), id)
                }
                "ReduceMean" => {
                    let x = get(&node.inputs[0], &values)?;
                    mean_of(&mut b, node, x, &values)?
                }
                "Pow" => {
                    let x = get(&node.inputs[0], &values)?;
                    let exponent = match node.inputs.get(1).and_then(|v| values.get(v.as_str())) {
                        Some(Val::Static(f)) => f.scalar(),
                        _ => None,
                    };
                    match exponent {
                    Some(1.0) => x,
                    Some(2.0) => {
                        let id = b.ir.square(&x.id).map_err(|e| why(&e.to_string()))?;
                        method(x, "square()".into(), id)
                    }
                    Some(0.5) => b.unary(node, UnaryOp::Sqrt, &x)?,
                    _ => {
                        return Err(why(
                            "a Pow of a computed value by other than 2, ½ or 1 (translated as .square() and .sqrt())",
                        ))
                    }
                }
                }
                "Expand" => {
                    // Only where it changes nothing: Kiln's arithmetic broadcasts by itself,
                    // but an expanded value of its own has no method yet.
                    let x = get(&node.inputs[0], &values)?;
                    let dims = b.dims(x.id);
                    let target = known_ints(node, 1, &values, graph.opset)?.unwrap_or_default();
                    let same = target.len() <= dims.len()
                        && target
                            .iter()
                            .rev()
                            .zip(dims.iter().rev())
                            .all(|(&t, d)| t == 1 || d.as_lit() == Some(t as usize));
                    if !same {
                        return Err(why(&format!(
                        "an Expand of [{}] to {target:?}, which makes it larger (Kiln's arithmetic broadcasts; other uses are not translated)",
                        list(&dims)
                    )));
                    }
                    x
                }
                "AveragePool" => {
                    let x = get(&node.inputs[0], &values)?;
                    let spec = average_pool(graph, node)?;
                    b.layer(node, spec, &node.name, vec![], &x)?
                }
                "LayerNormalization" => {
                    let x = get(&node.inputs[0], &values)?;
                    let (spec, tensors) = layer_norm(graph, node, b.dims(x.id).len())?;
                    b.layer(node, spec, &node.inputs[1], tensors, &x)?
                }
                "Gather" => {
                    let table = graph
                        .initializers
                        .get(&node.inputs[0])
                        .filter(|t| t.dims.len() == 2 && int_attr(node, "axis", 0).ok() == Some(0))
                        .ok_or_else(|| {
                            why("a Gather that is not a lookup in a table of rows (an embedding)")
                        })?;
                    let spec = layer_spec(
                        node,
                        "Embedding",
                        &[table.dims[0], table.dims[1]],
                        graph.opset,
                    )?;
                    // A table read at the positions 0..T is `self.pos.positions(ids)`, `ids`
                    // the input whose last size is T.
                    let (ids, via) = match values.get(node.inputs[1].as_str()) {
                        Some(Val::Positions(n)) => {
                            let ids = match values.get(input.name.as_str()) {
                                Some(Val::Dyn(e)) if b.dims(e.id).last() == Some(n) => e.clone(),
                                _ => {
                                    return Err(why(&format!(
                                        "positions 0..{n}, and {n} is not the input's last size"
                                    )))
                                }
                            };
                            let at =
                                b.ir.positions(&ids.id, table.dims[0])
                                    .map_err(|e| why(&e.to_string()))?;
                            (Expr { id: at, ..ids }, Some("positions"))
                        }
                        _ => (get(&node.inputs[1], &values)?, None),
                    };
                    b.layer_via(
                        node,
                        spec,
                        &node.inputs[0],
                        vec![("weight", (**table).clone())],
                        &ids,
                        via,
                    )?
                }
                "MatMul" => {
                    let (x, y) = (
                        get(&node.inputs[0], &values)?,
                        get(&node.inputs[1], &values)?,
                    );
                    let id = b.ir.matmul(&x.id, &y.id).map_err(|e| why(&e.to_string()))?;
                    // Both operands named, as a product of two computed values is written.
                    let (xs, ys) = (
                        b.bind(&Expr {
                            layer_call: false,
                            ..x
                        }),
                        b.bind(&Expr {
                            layer_call: false,
                            ..y
                        }),
                    );
                    Expr {
                        code: format!("{xs}.matmul({ys})"),
                        plain: false,
                        layer_call: false,
                        hint: "h".into(),
                        id,
                    }
                }
                "Add" | "Sub" | "Mul" | "Div" => arithmetic(&mut b, node, &values, &get)?,
                "Conv" => {
                    let x = get(&node.inputs[0], &values)?;
                    let (spec, tensors) = conv(graph, node)?;
                    b.layer(node, spec, &node.inputs[1], tensors, &x)?
                }
                "BatchNormalization" => {
                    let x = get(&node.inputs[0], &values)?;
                    let (spec, tensors) = batch_norm(graph, node)?;
                    b.layer(node, spec, &node.inputs[1], tensors, &x)?
                }
                "MaxPool" => {
                    let x = get(&node.inputs[0], &values)?;
                    let spec = max_pool(graph, node)?;
                    b.layer(node, spec, &node.name, vec![], &x)?
                }
                "GlobalAveragePool" => {
                    let x = get(&node.inputs[0], &values)?;
                    let dims = b.dims(x.id);
                    let side = match dims.as_slice() {
                        [_, _, h, w] if h.as_lit().is_some() && h.as_lit() == w.as_lit() => {
                            h.as_lit()
                        }
                        _ => None,
                    };
                    let Some(side) = side else {
                        return Err(why(
                        "a global average pool of a value that is not [N, C, S, S] with a fixed S",
                    ));
                    };
                    let spec = layer_spec(node, "AvgPool2d", &[side, side], graph.opset)?;
                    b.layer(node, spec, &node.name, vec![], &x)?
                }
                op => match elementwise(op) {
                    Some(u) => {
                        let x = get(&node.inputs[0], &values)?;
                        b.unary(node, u, &x)?
                    }
                    // Folded where its inputs are known at import time; on computed tensors
                    // not translated yet.
                    None => return Err(why(&format!("a {op} of tensors computed at run time"))),
                },
            },
        };
        // A value read more than once is computed once, in a `let` (a GELU written out
        // reads its input twice inside; `.gelu()` once).
        let reads = readers.get(out).map_or(0, |r| {
            r.iter()
                .filter(|n| !inside.contains(n.name.as_str()))
                .count()
        }) + composite_reads.get(out).copied().unwrap_or(0);
        // A long chain (a thousand ops in a row) is bound too: each value holds its own
        // code, so unbound chains would cost memory quadratic in their length.
        let result = if (reads > 1 || result.code.len() > LONGEST_INLINE_CODE) && !result.plain {
            let name = b.bind(&Expr {
                layer_call: false,
                ..result.clone()
            });
            Expr {
                code: name,
                plain: true,
                layer_call: false,
                ..result
            }
        } else {
            result
        };
        values.insert(out, Val::Dyn(result));
    }
    let result = match values.get(output.name.as_str()) {
        Some(Val::Dyn(e)) => e.clone(),
        Some(Val::Static(_) | Val::Positions(_) | Val::Band(_)) => {
            return Err(ImportError::Feature(format!(
                "the output `{}` is a constant (nothing of it depends on the input)",
                output.name
            )))
        }
        None => {
            return Err(ImportError::Invalid(format!(
                "the output `{}` is never computed",
                output.name
            )))
        }
    };
    let result_dims = b.dims(result.id);
    if let Some(declared) = &output.dims {
        check_declared(&output.name, declared, &result_dims)?;
    }
    let name = name.to_string();
    let input_type = format!("{}{input_suffix}", list(&input_dims));
    let source = source(
        &name,
        file,
        graph,
        &params,
        (&arg, &input_type),
        &b,
        (&result, &result_dims),
    );
    Ok(Translation {
        name,
        source,
        tensors: b.tensors,
    })
}

/// Whether a `MatMul` is a layer's weight product: by an initializer matrix, its only
/// reader an `Add` (of the layer's bias).
fn pending_matmul_ok(
    graph: &Graph,
    node: &Node,
    readers: &HashMap<&str, Vec<&Node>>,
    out: &str,
) -> bool {
    let adds_bias = readers
        .get(out)
        .map(Vec::as_slice)
        .is_some_and(|r| matches!(r, [add] if add.op == "Add"));
    adds_bias
        && graph
            .initializers
            .get(&node.inputs[1])
            .is_some_and(|w| w.dims.len() == 2)
}

/// A method chain longer than rustfmt's 60-column chain width, one call a line as
/// rustfmt writes it (`self` / `.q(x)` / `.reshape::<..>()`); anything else as is.
fn chain_lines(code: &str) -> String {
    if code.len() <= 60 {
        return code.to_string();
    }
    // Split at the dots outside brackets.
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in code.char_indices() {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' => depth -= 1,
            '.' if depth == 0 => {
                parts.push(&code[start..i]);
                start = i;
            }
            _ => {}
        }
    }
    parts.push(&code[start..]);
    let ident = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let calls = parts[1..].iter().all(|p| {
        p.chars()
            .nth(1)
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
    });
    if parts.len() < 3 || !ident(parts[0]) || !calls {
        return code.to_string();
    }
    let mut out = parts[0].to_string();
    for p in &parts[1..] {
        out += "\n            ";
        out += p;
    }
    out
}

/// `code` without parentheses around all of it (`(a + b)` as a statement's value).
fn without_outer_parens(code: &str) -> &str {
    let Some(inner) = code.strip_prefix('(').and_then(|c| c.strip_suffix(')')) else {
        return code;
    };
    // Only if the first parenthesis closes at the end.
    let mut depth = 0i32;
    for c in inner.chars() {
        depth += match c {
            '(' => 1,
            ')' => -1,
            _ => 0,
        };
        if depth < 0 {
            return code;
        }
    }
    inner
}

/// The only reader of `v`, if it has one and it is an `op`.
fn only_reader<'g>(readers: &HashMap<&str, Vec<&'g Node>>, v: &str, op: &str) -> Option<&'g Node> {
    match readers.get(v).map(Vec::as_slice) {
        Some([n]) if n.op == op => Some(*n),
        _ => None,
    }
}

/// The operand of a two-input node that is not `v`.
fn other_operand<'g>(n: &'g Node, v: &str) -> Option<&'g str> {
    match n.inputs.as_slice() {
        [a, b] if a == v => Some(b.as_str()),
        [a, b] if b == v => Some(a.as_str()),
        _ => None,
    }
}

/// The exact GELUs PyTorch writes out, `(x * (erf(x / √2) + 1)) * 0.5`, each operand
/// order: each result's value mapped to its `x`, and the names of the nodes inside
/// (whose values nothing else reads).
fn exact_gelus<'g>(
    graph: &'g Graph,
    readers: &HashMap<&str, Vec<&'g Node>>,
) -> (HashMap<&'g str, &'g str>, HashSet<&'g str>) {
    let constant = |v: &str| scalar_constant(graph, v);
    let near =
        |v: &str, want: f64| constant(v).is_some_and(|c| (c - want).abs() <= 1e-6 * want.abs());
    let only = |v: &str, op: &str| only_reader(readers, v, op);
    let (mut gelus, mut inside) = (HashMap::new(), HashSet::new());
    for erf in graph.nodes.iter().filter(|n| n.op == "Erf") {
        let found = (|| {
            let div = graph
                .nodes
                .iter()
                .find(|n| n.op == "Div" && n.outputs.first() == erf.inputs.first())?;
            let x = div.inputs.first()?.as_str();
            if !near(div.inputs.get(1)?, std::f64::consts::SQRT_2)
                || only(&div.outputs[0], "Erf")?.name != erf.name
            {
                return None;
            }
            let add = only(&erf.outputs[0], "Add")?;
            if !near(other_operand(add, &erf.outputs[0])?, 1.0) {
                return None;
            }
            let times_x = only(&add.outputs[0], "Mul")?;
            if other_operand(times_x, &add.outputs[0])? != x {
                return None;
            }
            let half = only(&times_x.outputs[0], "Mul")?;
            if !near(other_operand(half, &times_x.outputs[0])?, 0.5) {
                return None;
            }
            Some((x, [div, erf, add, times_x], half))
        })();
        if let Some((x, nodes, half)) = found {
            gelus.insert(half.outputs[0].as_str(), x);
            inside.extend(nodes.iter().map(|n| n.name.as_str()));
        }
    }
    (gelus, inside)
}

/// What `node` computes if it ends an exact GELU or a layer norm written out (the
/// nodes inside them write nothing): `x.gelu()`, or the `LayerNorm` layer applied.
fn written_out<'g>(
    node: &Node,
    norms: &HashMap<&str, WrittenLayerNorm<'g>>,
    gelus: &HashMap<&str, &'g str>,
    values: &HashMap<&str, Val>,
    b: &mut Translator,
    graph: &Graph,
) -> Result<Option<Expr>> {
    let Some(out) = node.outputs.first().map(String::as_str) else {
        return Ok(None);
    };
    let (x, what) = match (norms.get(out), gelus.get(out)) {
        (Some(norm), _) => (norm.x, "layer norm"),
        (None, Some(x)) => (*x, "GELU"),
        (None, None) => return Ok(None),
    };
    let why = |what: &str| unsupported(node, what, graph.opset);
    let Some(Val::Dyn(x)) = values.get(x) else {
        return Err(why(&format!("a {what} of a value known at import time")));
    };
    let x = x.clone();
    Ok(Some(match norms.get(out) {
        Some(norm) => {
            let (spec, tensors) = norm.layer(graph, node, b.dims(x.id).len())?;
            b.layer(node, spec, norm.weight, tensors, &x)?
        }
        None => {
            let id = b.ir.gelu_erf(&x.id).map_err(|e| why(&e.to_string()))?;
            method(x, "gelu()".into(), id)
        }
    }))
}

/// A layer norm over the last axis as exporters write it out before opset 17:
/// `d = x - mean(x)`, `d / sqrt(mean(d²) + ε) * weight + bias`.
struct WrittenLayerNorm<'g> {
    x: &'g str,
    weight: &'g str,
    bias: &'g str,
    eps: f64,
}

impl WrittenLayerNorm<'_> {
    /// Its `LayerNorm` and tensors, as `LayerNormalization`'s.
    fn layer(
        &self,
        graph: &Graph,
        node: &Node,
        rank: usize,
    ) -> Result<(LayerSpec, Vec<(&'static str, Tensor)>)> {
        let why = |what: &str| unsupported(node, what, graph.opset);
        if (self.eps - kiln_tensor::nn::spec::LAYER_NORM_EPS).abs() > 1e-9 {
            return Err(why(&format!(
                "a layer norm written out with epsilon {} (Kiln's uses 1e-5)",
                self.eps
            )));
        }
        let tensor = |name: &str| {
            graph
                .initializers
                .get(name)
                .map(|t| (**t).clone())
                .ok_or_else(|| why("a layer norm whose scale or bias is not an initializer"))
        };
        let (weight, bias) = (tensor(self.weight)?, tensor(self.bias)?);
        if rank == 0 || weight.dims.len() != 1 || bias.dims != weight.dims {
            return Err(why(
                "a layer norm whose scale and bias are not one vector each",
            ));
        }
        let spec = layer_spec(node, "LayerNorm", &[weight.data.len()], graph.opset)?;
        Ok((spec, vec![("weight", weight), ("bias", bias)]))
    }
}

/// The layer norms written out (opsets before 17: `ReduceMean`, `Sub`, `Pow` by 2,
/// `ReduceMean`, `Add` of ε, `Sqrt`, `Div`, `Mul` by the scale, `Add` of the bias),
/// each by its result's value, and the names of the nodes inside them.
fn written_out_layer_norms<'g>(
    graph: &'g Graph,
    readers: &HashMap<&str, Vec<&'g Node>>,
) -> (HashMap<&'g str, WrittenLayerNorm<'g>>, HashSet<&'g str>) {
    let constant = |v: &str| scalar_constant(graph, v);
    let only = |v: &str, op: &str| only_reader(readers, v, op);
    // A mean over the last axis, its axes an attribute (before opset 18) or an input.
    let last_axis_mean = |n: &Node| {
        let axes: Option<Vec<i64>> = match n.inputs.get(1) {
            Some(a) => held_constant(graph, a).and_then(|t| match &t.data {
                TensorData::I64(v) => Some(v.clone()),
                _ => None,
            }),
            None => match n.attributes.get("axes") {
                Some(Attribute::Ints(v)) => Some(v.clone()),
                _ => None,
            },
        };
        n.op == "ReduceMean"
            && axes.as_deref() == Some(&[-1])
            && int_attr(n, "keepdims", 1).ok() == Some(1)
    };
    let (mut norms, mut inside) = (HashMap::new(), HashSet::new());
    for mean in graph.nodes.iter().filter(|n| last_axis_mean(n)) {
        let found = (|| {
            let x = mean.inputs.first()?.as_str();
            let sub = graph.nodes.iter().find(|n| {
                n.op == "Sub"
                    && n.inputs.first().map(String::as_str) == Some(x)
                    && n.inputs.get(1) == mean.outputs.first()
            })?;
            let d = sub.outputs.first()?.as_str();
            let mean_readers = readers.get(mean.outputs.first()?.as_str())?;
            let d_readers = readers.get(d)?;
            let pow = d_readers.iter().find(|n| n.op == "Pow")?;
            let div = d_readers.iter().find(|n| n.op == "Div")?;
            if mean_readers.len() != 1
                || d_readers.len() != 2
                || pow.inputs.first().map(String::as_str) != Some(d)
                || constant(pow.inputs.get(1)?) != Some(2.0)
            {
                return None;
            }
            let var = only(&pow.outputs[0], "ReduceMean").filter(|n| last_axis_mean(n))?;
            let add_eps = only(&var.outputs[0], "Add")?;
            let eps = constant(other_operand(add_eps, &var.outputs[0])?)?;
            let sqrt = only(&add_eps.outputs[0], "Sqrt")?;
            if div.inputs.first().map(String::as_str) != Some(d)
                || div.inputs.get(1) != sqrt.outputs.first()
                || only(&sqrt.outputs[0], "Div")?.name != div.name
            {
                return None;
            }
            let scale = only(&div.outputs[0], "Mul")?;
            let weight = other_operand(scale, &div.outputs[0])?;
            let shift = only(&scale.outputs[0], "Add")?;
            let bias = other_operand(shift, &scale.outputs[0])?;
            if !graph.initializers.contains_key(weight) || !graph.initializers.contains_key(bias) {
                return None;
            }
            let parts = [mean, sub, *pow, var, add_eps, sqrt, *div, scale];
            Some((
                shift,
                parts,
                WrittenLayerNorm {
                    x,
                    weight,
                    bias,
                    eps,
                },
            ))
        })();
        if let Some((shift, parts, norm)) = found {
            norms.insert(shift.outputs[0].as_str(), norm);
            inside.extend(parts.iter().map(|n| n.name.as_str()));
        }
    }
    (norms, inside)
}

/// The value of `v` if it is one number held in the file: an initializer or a
/// `Constant`'s.
fn scalar_constant(graph: &Graph, v: &str) -> Option<f64> {
    let held = held_constant(graph, v)?;
    // Only a single value is converted (a weight read here is not).
    (held.data.len() == 1)
        .then(|| Folded::of(held).scalar())
        .flatten()
}

/// The tensor `v` is if the file holds it: an initializer or a `Constant`'s value.
fn held_constant<'g>(graph: &'g Graph, v: &str) -> Option<&'g Tensor> {
    match graph.initializers.get(v) {
        Some(t) => Some(t),
        None => {
            let node = graph
                .nodes
                .iter()
                .find(|n| n.op == "Constant" && n.outputs.first().map(String::as_str) == Some(v))?;
            match node.attributes.get("value") {
                Some(Attribute::Tensor(t)) => Some(t),
                _ => None,
            }
        }
    }
}

/// The name for `let`s of a layer's results: its field's name after the index of the
/// block it is in (`blocks_layers_0_self_attn` → `self_attn`), or all of it (`qkv_0`).
fn local_hint(field: &str) -> String {
    let parts: Vec<&str> = field.split('_').collect();
    match parts
        .iter()
        .rposition(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    {
        Some(i) if i + 1 < parts.len() => parts[i + 1..].join("_"),
        _ => field.to_string(),
    }
}

/// `x.<call>` recorded as `id`.
fn method(x: Expr, call: String, id: NodeId) -> Expr {
    Expr {
        code: format!("{}.{call}", x.code),
        plain: false,
        layer_call: false,
        hint: x.hint,
        id,
    }
}

/// Elementwise arithmetic of two computed values (`(a + b)`, broadcasting as Kiln
/// does), or of a computed value and an import-time scalar (`(a * 0.5)`).
fn arithmetic<'g>(
    b: &mut Translator,
    node: &Node,
    values: &HashMap<&'g str, Val>,
    get: &ValueOf<'g>,
) -> Result<Expr> {
    use kiln_tensor::BinaryOp;
    let opset = b.opset;
    let why = |what: &str| unsupported(node, what, opset);
    let op = match node.op.as_str() {
        "Add" => (BinaryOp::Add, "+"),
        "Sub" => (BinaryOp::Sub, "-"),
        "Mul" => (BinaryOp::Mul, "*"),
        _ => (BinaryOp::Div, "/"),
    };
    let scalar = |v: &str| match values.get(v) {
        Some(Val::Static(f)) if f.dims.iter().product::<usize>() == 1 => {
            f.scalar().filter(|x| x.is_finite())
        }
        _ => None,
    };
    let (a, c) = (&node.inputs[0], &node.inputs[1]);
    // A scalar on the left of + and * moves to the right; of - and / it cannot.
    let (x, s) = match (scalar(a), scalar(c)) {
        (None, Some(s)) => (get(a, values)?, Some(s)),
        (Some(s), None) if matches!(op.0, BinaryOp::Add | BinaryOp::Mul) => {
            (get(c, values)?, Some(s))
        }
        (Some(_), None) => return Err(why("a scalar minus or over a tensor")),
        _ => (get(a, values)?, None),
    };
    // Operands too long for one line of `a + b` are named by `let`s.
    let x = Expr {
        code: b.bind_long(&x),
        ..x
    };
    let (id, code) = match s {
        Some(s) => {
            let k =
                b.ir.scalar_like(&x.id, s)
                    .map_err(|e| why(&e.to_string()))?;
            let id =
                b.ir.binary(op.0, &x.id, &k)
                    .map_err(|e| why(&e.to_string()))?;
            (id, format!("({} {} {})", x.code, op.1, float_literal(s)))
        }
        None => {
            let y = get(c, values)?;
            let id =
                b.ir.binary(op.0, &x.id, &y.id)
                    .map_err(|e| why(&e.to_string()))?;
            let y = b.bind_long(&y);
            (id, format!("({} {} {})", x.code, op.1, y))
        }
    };
    Ok(Expr {
        code,
        plain: false,
        layer_call: false,
        hint: x.hint,
        id,
    })
}

/// `Range` and the ops building a causal mask's triangle, where they read values known
/// at import time (`None` for any other node, which translation takes as usual):
/// `Range(0, n, 1)` is the positions `0..n`; `ConstantOfShape` of a matrix, `Trilu` of
/// ones, and `Cast`, `Identity`, `Not` or `Equal` to a number of a triangle are
/// [`Band`]s.
fn pattern(node: &Node, values: &HashMap<&str, Val>, opset: i64) -> Option<Result<Val>> {
    let why = |what: &str| unsupported(node, what, opset);
    let input = |i: usize| {
        node.inputs
            .get(i)
            .filter(|n| !n.is_empty())
            .and_then(|n| values.get(n.as_str()))
    };
    let band = |i: usize| match input(i) {
        Some(Val::Band(b)) => Some(b.clone()),
        _ => None,
    };
    let known = |i: usize| match input(i) {
        Some(Val::Static(f)) => Some(f),
        _ => None,
    };
    // A folded value of one integer.
    let one = |f: &Folded| match f.ints() {
        Some([d]) => Some(d.clone()),
        _ => None,
    };
    Some(match node.op.as_str() {
        "Range" => {
            let (start, limit, delta) = (known(0)?, known(1)?, known(2)?);
            match (one(start), one(limit), one(delta)) {
                (Some(s), Some(n), Some(d)) if s.as_lit() == Some(0) && d.as_lit() == Some(1) => {
                    Ok(Val::Positions(n))
                }
                _ => Err(why(
                    "a Range other than 0..n by 1 (translated as the positions of a sequence)",
                )),
            }
        }
        "ConstantOfShape" => {
            let shape = known(0)?;
            let value = match node.attributes.get("value") {
                None => Some(false),
                Some(Attribute::Tensor(t)) if t.data.len() == 1 => nonzero(&Folded::of(t)),
                Some(_) => None,
            };
            match (shape.ints(), value) {
                (Some([rows, cols]), Some(set)) => Ok(Val::Band(Band {
                    dims: [rows.clone(), cols.clone()],
                    rule: None,
                    negated: !set,
                })),
                _ => Err(why(
                    "a ConstantOfShape that is not a matrix of one number (translated as the ones of a causal mask)",
                )),
            }
        }
        "Trilu" => {
            let b = band(0)?;
            let k = match input(1) {
                None => Some(0),
                Some(Val::Static(f)) => one(f).as_ref().and_then(crate::fold::signed),
                Some(_) => None,
            };
            let upper = match int_attr(node, "upper", 1) {
                Ok(u) => u != 0,
                Err(e) => return Some(Err(e)),
            };
            match (k, b.rule, b.negated) {
                (Some(k), None, false) => Ok(Val::Band(Band {
                    rule: Some((upper, k)),
                    ..b
                })),
                (Some(_), None, true) => Ok(Val::Band(b)),
                _ => Err(why(
                    "a Trilu of a triangle, or by a diagonal known only at run time",
                )),
            }
        }
        "Cast" | "Identity" => Ok(Val::Band(band(0)?)),
        "Not" => Ok(Val::Band(band(0)?.negated())),
        "Equal" => {
            let (b, other) = match (band(0), band(1)) {
                (Some(b), None) => (b, known(1)),
                (None, Some(b)) => (b, known(0)),
                _ => return None,
            };
            match other.and_then(nonzero) {
                Some(true) => Ok(Val::Band(b)),
                Some(false) => Ok(Val::Band(b.negated())),
                None => Err(why(
                    "an Equal of a triangle to something other than a number",
                )),
            }
        }
        _ => return None,
    })
}

/// Whether a folded value of one element is not zero (`None`: not one number).
fn nonzero(f: &Folded) -> Option<bool> {
    match &f.data {
        crate::fold::FoldedData::Bools(v) if v.len() == 1 => Some(v[0]),
        _ => f.scalar().map(|x| x != 0.0),
    }
}

/// The scores a `Where` masks causally: `Where(mask, fill, scores)` with `mask` the
/// triangle above the diagonal (or `Where(keep, scores, fill)` with its complement),
/// `fill` −∞ or a number at most −1e9, and the result read only by softmaxes over
/// its last axis. Kiln's `.causal_mask()` pushes scores down by the largest finite
/// float instead of filling them, which a softmax cannot tell apart.
fn causal_mask_of<'v>(
    node: &'v Node,
    values: &HashMap<&str, Val>,
    readers: &HashMap<&str, Vec<&Node>>,
    opset: i64,
) -> Result<&'v str> {
    let why = |what: &str| unsupported(node, what, opset);
    let [cond, a, c] = node.inputs.as_slice() else {
        return Err(why("a Where without three inputs"));
    };
    let Some(Val::Band(mask)) = values.get(cond.as_str()) else {
        return Err(why(
            "a Where whose condition is not a triangle of ones (only causal masks are translated)",
        ));
    };
    let fill = |v: &str| match values.get(v) {
        Some(Val::Static(f)) => f.scalar().is_some_and(|x| x <= -1e9),
        _ => false,
    };
    let (hidden, scores) = match (fill(a), fill(c)) {
        (true, false) => (mask.clone(), c),
        (false, true) => (mask.clone().negated(), a),
        _ => return Err(why(
            "a Where that does not choose between scores and −∞ (only causal masks are translated)",
        )),
    };
    if !hidden.is_above_diagonal() {
        return Err(why(
            "a Where that hides another triangle than the keys after each query (a causal mask hides j > i)",
        ));
    }
    let out = node.outputs.first().map(String::as_str).unwrap_or("");
    let softmax_last = |n: &&Node| n.op == "Softmax" && matches!(int_attr(n, "axis", -1), Ok(-1));
    if !readers
        .get(out)
        .is_some_and(|r| !r.is_empty() && r.iter().all(softmax_last))
    {
        return Err(why(
            "a causal mask read by something other than a softmax over the last axis",
        ));
    }
    Ok(scores)
}

/// The ONNX element type `to` as Kiln's dtype (int64 as i32, as integer inputs are).
fn onnx_dtype(to: i64) -> Option<DType> {
    Some(match to {
        1 => DType::F32,
        6 | 7 => DType::I32,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        12 => DType::U32,
        16 => DType::BF16,
        _ => return None,
    })
}

/// `x` reshaped to `dims` (`x` itself where they are its dims): `.reshape::<..>()`,
/// a size that is a product of sizes written `Dyn` (solved from the element count).
fn reshaped(b: &mut Translator, node: &Node, x: Expr, dims: Vec<SDim>) -> Result<Expr> {
    if b.dims(x.id) == dims {
        return Ok(x);
    }
    // A reshape of a reshape just written reshapes what that one read.
    let x = match b.reshapes.get(&x.id) {
        Some((code, before, id)) if *code == x.code => Expr {
            code: before.clone(),
            id: *id,
            ..x
        },
        _ => x,
    };
    if b.dims(x.id) == dims {
        return Ok(x);
    }
    let args = reshape_args(&dims).ok_or_else(|| {
        unsupported(
            node,
            &format!(
                "a reshape to [{}], with more than one size that is a product of sizes",
                list(&dims)
            ),
            b.opset,
        )
    })?;
    let id =
        b.ir.reshape(&x.id, dims)
            .map_err(|e| unsupported(node, &e.to_string(), b.opset))?;
    let (before, before_id) = (x.code.clone(), x.id);
    let y = method(x, format!("reshape::<{args}>()"), id);
    b.reshapes.insert(id, (y.code.clone(), before, before_id));
    Ok(y)
}

/// `len` elements of `x` from `start` along `axis`: `.narrow::<AXIS, START, LEN>()`.
fn narrowed(
    b: &mut Translator,
    node: &Node,
    x: Expr,
    (axis, start, len): (usize, usize, usize),
) -> Result<Expr> {
    let id =
        b.ir.narrow(&x.id, axis, start, len)
            .map_err(|e| unsupported(node, &e.to_string(), b.opset))?;
    Ok(method(x, format!("narrow::<{axis}, {start}, {len}>()"), id))
}

/// A list of integers known at import time, input `i` of `node` (`None` where absent).
fn known_ints(
    node: &Node,
    i: usize,
    values: &HashMap<&str, Val>,
    opset: i64,
) -> Result<Option<Vec<i64>>> {
    let Some(v) = node.inputs.get(i).filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    match values.get(v.as_str()) {
        Some(Val::Static(f)) => f
            .ints()
            .and_then(|d| {
                d.iter()
                    .map(crate::fold::signed)
                    .collect::<Option<Vec<_>>>()
            })
            .map(Some)
            .ok_or_else(|| {
                unsupported(
                    node,
                    &format!("`{v}` is not integers known at import time"),
                    opset,
                )
            }),
        _ => Err(unsupported(
            node,
            &format!("`{v}` is computed at run time (translated where it is known at import time)"),
            opset,
        )),
    }
}

/// An axis counted from the end where negative, checked against `rank`.
fn axis_of(node: &Node, axis: i64, rank: usize, opset: i64) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(unsupported(
            node,
            &format!("axis {axis} of a rank-{rank} value"),
            opset,
        ))
    }
}

/// The dims after an `Unsqueeze` (ones inserted at its axes) or a `Squeeze` (its
/// axes, each of size 1, removed; without axes every literal 1).
fn squeezed(
    node: &Node,
    dims: &[SDim],
    values: &HashMap<&str, Val>,
    opset: i64,
) -> Result<Vec<SDim>> {
    let axes = known_ints(node, 1, values, opset)?;
    let mut out = dims.to_vec();
    if node.op == "Unsqueeze" {
        let axes = axes.ok_or_else(|| unsupported(node, "an Unsqueeze without axes", opset))?;
        let rank = dims.len() + axes.len();
        let mut at = axes
            .iter()
            .map(|&a| axis_of(node, a, rank, opset))
            .collect::<Result<Vec<_>>>()?;
        at.sort_unstable();
        at.dedup();
        if at.len() != axes.len() {
            return Err(unsupported(
                node,
                "an Unsqueeze naming an axis twice",
                opset,
            ));
        }
        for a in at {
            out.insert(a, SDim::lit(1));
        }
        return Ok(out);
    }
    let mut at = match axes {
        Some(axes) => axes
            .iter()
            .map(|&a| axis_of(node, a, dims.len(), opset))
            .collect::<Result<Vec<_>>>()?,
        None => (0..dims.len())
            .filter(|&i| dims[i].as_lit() == Some(1))
            .collect(),
    };
    at.sort_unstable();
    at.dedup();
    for &a in at.iter().rev() {
        if dims[a].as_lit() != Some(1) {
            return Err(unsupported(
                node,
                &format!("a Squeeze of axis {a} of [{}], which is not 1", list(dims)),
                opset,
            ));
        }
        out.remove(a);
    }
    Ok(out)
}

/// A `Slice` of a computed value with bounds known at import time, step 1: one
/// `.narrow::<AXIS, START, LEN>()` per axis it shortens (ONNX's negative bounds count
/// from the end; bounds past the end are the end).
fn sliced(b: &mut Translator, node: &Node, x: Expr, values: &HashMap<&str, Val>) -> Result<Expr> {
    let opset = b.opset;
    let why = |what: &str| unsupported(node, what, opset);
    let ints = |i: usize| known_ints(node, i, values, opset);
    let starts = ints(1)?.ok_or_else(|| why("a Slice without starts"))?;
    let ends = ints(2)?.ok_or_else(|| why("a Slice without ends"))?;
    let axes = ints(3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = ints(4)?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(why(
            "a Slice whose starts, ends, axes and steps differ in length",
        ));
    }
    let dims = b.dims(x.id);
    let mut x = x;
    for (((&a, &s), &e), &step) in axes.iter().zip(&starts).zip(&ends).zip(&steps) {
        if step != 1 {
            return Err(why("a Slice with a step other than 1"));
        }
        let axis = axis_of(node, a, dims.len(), opset)?;
        // ONNX writes "to the end" as the largest int64.
        let to_end = e >= i64::MAX / 2;
        let (start, end) = match dims[axis].as_lit() {
            Some(n) => {
                let n = n as i64;
                let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
                (clamp(s), clamp(e))
            }
            None if s == 0 && to_end => continue,
            None if s >= 0 && e >= 0 && !to_end => (s, e),
            None => {
                return Err(why(&format!(
                    "a Slice {s}..{e} of axis {axis} of [{}], counted from its end, whose size is known only at run time",
                    list(&dims)
                )))
            }
        };
        if start == 0 && dims[axis].as_lit() == Some(end as usize) {
            continue;
        }
        let len = (end - start).max(0) as usize;
        x = narrowed(b, node, x, (axis, start as usize, len))?;
    }
    Ok(x)
}

/// A `Gather` of one index known at import time from a computed value: that slice
/// along the axis (`.narrow::<AXIS, I, 1>()`), the axis removed for a scalar index.
fn picked(b: &mut Translator, node: &Node, x: Expr, values: &HashMap<&str, Val>) -> Result<Expr> {
    let opset = b.opset;
    let why = |what: &str| unsupported(node, what, opset);
    let dims = b.dims(x.id);
    let axis = axis_of(node, int_attr(node, "axis", 0)?, dims.len(), opset)?;
    let index = match node.inputs.get(1).and_then(|v| values.get(v.as_str())) {
        Some(Val::Static(f)) => f,
        _ => {
            return Err(why(
                "a Gather from a computed value at indices computed at run time (an embedding's table must be an initializer)",
            ))
        }
    };
    let i = match index.ints() {
        Some([i]) => crate::fold::signed(i),
        _ => None,
    }
    .ok_or_else(|| why("a Gather of more than one index from a computed value"))?;
    let n = dims[axis].as_lit();
    let i = match (i, n) {
        (i, Some(n)) if i < 0 && i + n as i64 >= 0 => (i + n as i64) as usize,
        (i, _) if i >= 0 => i as usize,
        _ => {
            return Err(why(&format!(
                "a Gather at index {i} of axis {axis} of [{}]",
                list(&dims)
            )))
        }
    };
    let x = narrowed(b, node, x, (axis, i, 1))?;
    if index.dims.is_empty() {
        let mut out = dims;
        out.remove(axis);
        reshaped(b, node, x, out)
    } else {
        Ok(x)
    }
}

/// A float as a Rust literal that reads back to the same f32 (`0.5`, `2.0`).
fn float_literal(v: f64) -> String {
    let f = v as f32;
    let s = format!("{f:?}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// ONNX `Reshape`'s target against the input's dims: `0` copies the input's dim, one
/// `-1` is solved from the element count (after cancelling the sizes both sides name).
fn reshape_target(input: &[SDim], shape: &Folded) -> std::result::Result<Vec<SDim>, String> {
    let target = shape
        .ints()
        .ok_or("a Reshape to a shape that is not integers")?;
    let mut dims: Vec<Option<SDim>> = Vec::with_capacity(target.len());
    for (i, d) in target.iter().enumerate() {
        match crate::fold::signed(d) {
            Some(0) => dims.push(Some(
                input
                    .get(i)
                    .cloned()
                    .ok_or("a Reshape copying a dim the input lacks")?,
            )),
            Some(-1) => dims.push(None),
            Some(n) if n < 0 => return Err(format!("a Reshape to a dim of {n}")),
            _ => dims.push(Some(d.clone())),
        }
    }
    let open = dims.iter().filter(|d| d.is_none()).count();
    if open > 1 {
        return Err("a Reshape with two open dims".into());
    }
    if open == 1 {
        // Cancel the sizes named on both sides; what is left must be literal.
        let mut left: Vec<SDim> = input.to_vec();
        let mut right = Vec::new();
        for d in dims.iter().flatten() {
            match left.iter().position(|l| l == d) {
                Some(p) => {
                    left.remove(p);
                }
                None => right.push(d.clone()),
            }
        }
        let product = |v: &[SDim]| {
            v.iter()
                .try_fold(1usize, |p, d| d.as_lit().and_then(|n| p.checked_mul(n)))
        };
        let (l, r) = (product(&left), product(&right));
        let solved = match (l, r) {
            (Some(l), Some(r)) if r > 0 && l % r == 0 => l / r,
            _ => return Err("a Reshape whose open dim is not a whole number of the others".into()),
        };
        for d in dims.iter_mut().filter(|d| d.is_none()) {
            *d = Some(SDim::lit(solved));
        }
    }
    Ok(dims.into_iter().flatten().collect())
}

/// Dims as `reshape`'s const arguments (`BATCH, 2, 8`), one size that is a product or
/// sum of sizes as `Dyn` (`None` where more are).
fn reshape_args(dims: &[SDim]) -> Option<String> {
    let open = dims
        .iter()
        .filter(|d| d.as_lit().is_none() && d.as_param().is_none())
        .count();
    if open > 1 {
        return None;
    }
    Some(
        dims.iter()
            .map(|d| match (d.as_lit(), d.as_param()) {
                (Some(n), _) => n.to_string(),
                (_, Some(p)) => p.to_string(),
                _ => "Dyn".to_string(),
            })
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The `LayerNorm` a `LayerNormalization` over the last axis with initializer scale
/// and bias is (ε Kiln's, 1e-5).
fn layer_norm(
    graph: &Graph,
    node: &Node,
    rank: usize,
) -> Result<(LayerSpec, Vec<(&'static str, Tensor)>)> {
    let why = |what: &str| unsupported(node, what, graph.opset);
    let axis = int_attr(node, "axis", -1)?;
    if axis != -1 && axis != rank as i64 - 1 {
        return Err(why("a layer norm over more than the last axis"));
    }
    let eps = float_attr(node, "epsilon", 1e-5)? as f64;
    if (eps - kiln_tensor::nn::spec::LAYER_NORM_EPS).abs() > 1e-9 || node.outputs.len() > 1 {
        return Err(why(&format!(
            "epsilon {eps} or statistics outputs (Kiln's layer norm uses 1e-5)"
        )));
    }
    let scale = initializer(graph, node, 1, "scale")?.clone();
    let bias = match node.inputs.get(2).filter(|n| !n.is_empty()) {
        Some(_) => initializer(graph, node, 2, "bias")?.clone(),
        None => Tensor {
            dims: scale.dims.clone(),
            data: TensorData::F32(vec![0.0; scale.data.len()]),
        },
    };
    let spec = layer_spec(node, "LayerNorm", &[scale.data.len()], graph.opset)?;
    Ok((spec, vec![("weight", scale), ("bias", bias)]))
}

/// The ONNX ops that are one elementwise op of Kiln's table with the same meaning.
const ELEMENTWISE: &[&str] = &[
    "Relu", "Sigmoid", "Tanh", "Sqrt", "Erf", "Abs", "Neg", "Exp", "Log",
];

/// Kiln's op for an ONNX elementwise op, found in Kiln's op table by name.
fn elementwise(op: &str) -> Option<UnaryOp> {
    if !ELEMENTWISE.contains(&op) {
        return None;
    }
    UnaryOp::ALL
        .iter()
        .copied()
        .find(|u| u.name().eq_ignore_ascii_case(op))
}

/// `graph` with what exporters compute from weights alone made initializers: an
/// `Identity` of an initializer (exporters alias equal initializers so: a second layer
/// norm's ones) an alias of it, a `Transpose` of a float initializer (an unfolded
/// export's `x · Wᵀ`) the transposed tensor; those nodes removed. Initializers are
/// shared, so the copy holds no second copy of the weights.
fn with_weights_resolved(graph: &Graph) -> Graph {
    let mut g = graph.clone();
    g.nodes.clear();
    for n in &graph.nodes {
        let (Some(input), [output]) = (n.inputs.first(), n.outputs.as_slice()) else {
            g.nodes.push(n.clone());
            continue;
        };
        let resolved = match (n.op.as_str(), g.initializers.get(input)) {
            ("Identity", Some(t)) if n.inputs.len() == 1 => Some(t.clone()),
            ("Transpose", Some(t)) => {
                let perm: Vec<usize> = match n.attributes.get("perm") {
                    Some(Attribute::Ints(p)) => p.iter().map(|&a| a as usize).collect(),
                    _ => (0..t.dims.len()).rev().collect(),
                };
                permuted(t, &perm).map(std::sync::Arc::new)
            }
            _ => None,
        };
        match resolved {
            Some(t) if !g.initializers.contains_key(output) => {
                g.initializers.insert(output.clone(), t);
            }
            _ => g.nodes.push(n.clone()),
        }
    }
    g
}

/// A float tensor with its axes reordered by `perm`, `None` for anything else.
fn permuted(t: &Tensor, perm: &[usize]) -> Option<Tensor> {
    let TensorData::F32(v) = &t.data else {
        return None;
    };
    let rank = t.dims.len();
    let mut seen = vec![false; rank];
    if perm.len() != rank
        || perm
            .iter()
            .any(|&a| a >= rank || std::mem::replace(&mut seen[a], true))
    {
        return None;
    }
    let dims: Vec<usize> = perm.iter().map(|&a| t.dims[a]).collect();
    // Row-major strides of the input, read in the output's axis order.
    let mut strides = vec![1usize; rank];
    for a in (0..rank.saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * t.dims[a + 1];
    }
    let read: Vec<usize> = perm.iter().map(|&a| strides[a]).collect();
    let mut out = Vec::with_capacity(v.len());
    let mut at = vec![0usize; rank];
    for _ in 0..v.len() {
        out.push(v[at.iter().zip(&read).map(|(i, s)| i * s).sum::<usize>()]);
        for a in (0..rank).rev() {
            at[a] += 1;
            if at[a] < dims[a] {
                break;
            }
            at[a] = 0;
        }
    }
    Some(Tensor {
        dims,
        data: TensorData::F32(out),
    })
}

/// The ops translated so far.
const TRANSLATED: &[&str] = &[
    "Expand",
    "LogSoftmax",
    "Gelu",
    "ReduceMean",
    "AveragePool",
    "Range",
    "ConstantOfShape",
    "Trilu",
    "Where",
    "Equal",
    "Not",
    "Gemm",
    "MatMul",
    "Add",
    "Identity",
    "Flatten",
    "Conv",
    "BatchNormalization",
    "MaxPool",
    "GlobalAveragePool",
    "Reshape",
    "Transpose",
    "Softmax",
    "LayerNormalization",
];

/// Every node whose op is not translated.
fn unsupported_nodes(graph: &Graph) -> Vec<UnsupportedNode> {
    graph
        .nodes
        .iter()
        .filter(|n| {
            let op = n.op.as_str();
            !TRANSLATED.contains(&op) && !FOLDED.contains(&op) && elementwise(op).is_none()
        })
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

/// Kiln's layer `name<args>`, by the library's own rules for its sizes.
fn layer_spec(node: &Node, name: &str, args: &[usize], opset: i64) -> Result<LayerSpec> {
    LayerSpec::from_type(name, args).map_err(|e| unsupported(node, &e, opset))
}

/// An initializer of `node`'s input `i`, or why not.
fn initializer<'g>(graph: &'g Graph, node: &Node, i: usize, what: &str) -> Result<&'g Tensor> {
    node.inputs
        .get(i)
        .and_then(|n| graph.initializers.get(n))
        .map(|t| &**t)
        .ok_or_else(|| {
            unsupported(
                node,
                &format!("a {} whose {what} is not an initializer", node.op),
                graph.opset,
            )
        })
}

/// An integer-list attribute, `default` where absent.
fn ints_attr(node: &Node, name: &str, default: &[i64]) -> Result<Vec<i64>> {
    match node.attributes.get(name) {
        None => Ok(default.to_vec()),
        Some(Attribute::Ints(v)) => Ok(v.clone()),
        Some(other) => Err(ImportError::Invalid(format!(
            "attribute `{name}` of node `{}` ({}) is {other:?}, not integers",
            node.name, node.op
        ))),
    }
}

/// The one value of a list whose entries are all equal (a square window, the same
/// padding on every side), or why not.
fn square(node: &Node, name: &str, v: &[i64], len: usize, opset: i64) -> Result<usize> {
    match v {
        [first, rest @ ..] if v.len() == len && rest.iter().all(|x| x == first) && *first >= 0 => {
            Ok(*first as usize)
        }
        _ => Err(unsupported(
            node,
            &format!("`{name}` {v:?} (Kiln's layers take square windows and the same padding on every side)"),
            opset,
        )),
    }
}

/// The `Linear` a `Gemm` over initializers is: `y = x·Bᵀ + C` (PyTorch's export,
/// `transB = 1`) or `y = x·B + C`.
fn gemm_linear(graph: &Graph, node: &Node) -> Result<(LayerSpec, Vec<(&'static str, Tensor)>)> {
    let why = |what: &str| unsupported(node, what, graph.opset);
    if float_attr(node, "alpha", 1.0)? != 1.0 || float_attr(node, "beta", 1.0)? != 1.0 {
        return Err(why("a Gemm with alpha or beta other than 1"));
    }
    if int_attr(node, "transA", 0)? != 0 {
        return Err(why("a Gemm with its input transposed"));
    }
    let (b, c) = (
        initializer(graph, node, 1, "weight")?,
        initializer(graph, node, 2, "bias")?,
    );
    let weight = match int_attr(node, "transB", 0)? {
        0 => transposed(b).ok_or_else(|| why("a Gemm whose weight is not a matrix of floats"))?,
        _ => b.clone(),
    };
    linear(node, weight, c, graph.opset)
}

/// The `Linear` a `MatMul` by an initializer `[in, out]` and the `Add` of `bias` are.
fn matmul_linear(
    graph: &Graph,
    node: &Node,
    bias: &str,
) -> Result<(LayerSpec, Vec<(&'static str, Tensor)>)> {
    let why = |what: &str| unsupported(node, what, graph.opset);
    let b = initializer(graph, node, 1, "weight")?;
    let c = graph
        .initializers
        .get(bias)
        .ok_or_else(|| why("a MatMul whose added bias is not an initializer"))?;
    let weight =
        transposed(b).ok_or_else(|| why("a MatMul whose weight is not a matrix of floats"))?;
    linear(node, weight, c, graph.opset)
}

/// A `Linear` of weight `[out, in]` and a bias of `out` values (`[out]` or `[1, out]`).
fn linear(
    node: &Node,
    weight: Tensor,
    bias: &Tensor,
    opset: i64,
) -> Result<(LayerSpec, Vec<(&'static str, Tensor)>)> {
    let [outputs, inputs] = weight.dims[..] else {
        return Err(unsupported(node, "a weight that is not a matrix", opset));
    };
    let bias = Tensor {
        dims: vec![bias.dims.iter().product()],
        data: bias.data.clone(),
    };
    let spec = layer_spec(node, "Linear", &[inputs, outputs], opset)?;
    Ok((spec, vec![("weight", weight), ("bias", bias)]))
}

/// The `Conv2d` a `Conv` over initializers is (square kernel and stride, the same
/// padding on every side, no dilation; a missing bias is zeros).
fn conv(graph: &Graph, node: &Node) -> Result<(LayerSpec, Vec<(&'static str, Tensor)>)> {
    let opset = graph.opset;
    let why = |what: &str| unsupported(node, what, opset);
    let weight = initializer(graph, node, 1, "weight")?.clone();
    let [outputs, per_group, kh, _] = weight.dims[..] else {
        return Err(why("a Conv that is not 2-d"));
    };
    let w = window(node, kh, opset)?;
    if w.dilation != 1 {
        return Err(why("a dilated Conv"));
    }
    let (kernel, stride, padding) = (w.kernel, w.stride, w.padding);
    let groups =
        usize::try_from(int_attr(node, "group", 1)?).map_err(|_| why("a negative group"))?;
    let bias = match node.inputs.get(2).filter(|n| !n.is_empty()) {
        Some(_) => initializer(graph, node, 2, "bias")?.clone(),
        None => Tensor {
            dims: vec![outputs],
            data: TensorData::F32(vec![0.0; outputs]),
        },
    };
    let args = [per_group * groups, outputs, kernel, stride, padding, groups];
    Ok((
        layer_spec(node, "Conv2d", &args, opset)?,
        vec![("weight", weight), ("bias", bias)],
    ))
}

/// The `BatchNorm2d` a `BatchNormalization` over initializers is, in inference (its
/// running statistics as buffers); its ε must be Kiln's (PyTorch's 1e-5).
fn batch_norm(graph: &Graph, node: &Node) -> Result<(LayerSpec, Vec<(&'static str, Tensor)>)> {
    let why = |what: &str| unsupported(node, what, graph.opset);
    let eps = float_attr(node, "epsilon", 1e-5)? as f64;
    if (eps - BATCH_NORM_EPS).abs() > 1e-9 {
        return Err(why(&format!(
            "epsilon {eps} (Kiln's batch norm uses {BATCH_NORM_EPS})"
        )));
    }
    if int_attr(node, "training_mode", 0)? != 0 || node.outputs.len() > 1 {
        return Err(why("a batch norm exported in training mode"));
    }
    let [scale, bias, mean, var] =
        [1, 2, 3, 4].map(|i| initializer(graph, node, i, "scale, bias or statistics"));
    let (scale, bias, mean, var) = (scale?.clone(), bias?.clone(), mean?.clone(), var?.clone());
    let spec = layer_spec(
        node,
        "BatchNorm2d",
        &[scale.dims.iter().product()],
        graph.opset,
    )?;
    Ok((
        spec,
        vec![
            ("weight", scale),
            ("bias", bias),
            ("running_mean", mean),
            ("running_var", var),
        ],
    ))
}

/// A square window as a convolution's or a pool's attributes give it.
struct Window {
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
}

/// The window of a `Conv` or a pool: `kernel_shape` (`default_kernel` where absent: a
/// convolution's weight gives it), `strides`, `pads` and `dilations`, each the same
/// along both axes (and on every side), and explicit padding.
fn window(node: &Node, default_kernel: usize, opset: i64) -> Result<Window> {
    if let Some(Attribute::String(pad)) = node.attributes.get("auto_pad") {
        if pad != "NOTSET" {
            return Err(unsupported(
                node,
                &format!("auto_pad {pad} (explicit pads only)"),
                opset,
            ));
        }
    }
    let k = default_kernel as i64;
    let kernel_default: &[i64] = if k > 0 { &[k, k] } else { &[] };
    let get = |name: &str, default: &[i64], len: usize| {
        square(node, name, &ints_attr(node, name, default)?, len, opset)
    };
    Ok(Window {
        kernel: get("kernel_shape", kernel_default, 2)?,
        stride: get("strides", &[1, 1], 2)?,
        padding: get("pads", &[0, 0, 0, 0], 4)?,
        dilation: get("dilations", &[1, 1], 2)?,
    })
}

/// The `MaxPool2d` a `MaxPool` is (square window and stride, no padding, dilation or
/// ceiling, no index output).
fn max_pool(graph: &Graph, node: &Node) -> Result<LayerSpec> {
    let opset = graph.opset;
    let why = |what: &str| unsupported(node, what, opset);
    let w = window(node, 0, opset)?;
    if w.padding != 0 {
        return Err(why("a padded MaxPool"));
    }
    if w.dilation != 1 || int_attr(node, "ceil_mode", 0)? != 0 || node.outputs.len() > 1 {
        return Err(why("a MaxPool with dilation, ceil_mode or an index output"));
    }
    let (kernel, stride) = (w.kernel, w.stride);
    layer_spec(node, "MaxPool2d", &[kernel, stride], opset)
}

/// The `AvgPool2d` an `AveragePool` is (square window and stride, no padding or
/// ceiling).
fn average_pool(graph: &Graph, node: &Node) -> Result<LayerSpec> {
    let opset = graph.opset;
    let w = window(node, 0, opset)?;
    if w.padding != 0 || w.dilation != 1 || int_attr(node, "ceil_mode", 0)? != 0 {
        return Err(unsupported(
            node,
            "an AveragePool with padding, dilation or ceil_mode",
            opset,
        ));
    }
    layer_spec(node, "AvgPool2d", &[w.kernel, w.stride], opset)
}

/// A `ReduceMean` of a computed value over axes known at import time: one
/// `.mean::<AXIS>()` per axis (the last first), then the kept axes as ones by a
/// reshape; over every axis without `keepdims`, `.mean_all()`.
fn mean_of(b: &mut Translator, node: &Node, x: Expr, values: &HashMap<&str, Val>) -> Result<Expr> {
    let opset = b.opset;
    let dims = b.dims(x.id);
    let axes = match node.attributes.get("axes") {
        Some(Attribute::Ints(v)) => Some(v.clone()),
        _ => known_ints(node, 1, values, opset)?,
    };
    let keep = int_attr(node, "keepdims", 1)? != 0;
    let mut at = match axes {
        Some(axes) if !axes.is_empty() => axes
            .iter()
            .map(|&a| axis_of(node, a, dims.len(), opset))
            .collect::<Result<Vec<_>>>()?,
        _ if int_attr(node, "noop_with_empty_axes", 0)? != 0 => return Ok(x),
        _ => (0..dims.len()).collect(),
    };
    at.sort_unstable();
    at.dedup();
    if at.len() == dims.len() && !keep {
        let id =
            b.ir.mean_all(&x.id)
                .map_err(|e| unsupported(node, &e.to_string(), opset))?;
        return Ok(method(x, "mean_all()".into(), id));
    }
    let mut y = x;
    for &a in at.iter().rev() {
        let id =
            b.ir.mean(&y.id, &[a], false)
                .map_err(|e| unsupported(node, &e.to_string(), opset))?;
        y = method(y, format!("mean::<{a}>()"), id);
    }
    if keep {
        let mut kept = dims;
        for &a in &at {
            kept[a] = SDim::lit(1);
        }
        y = reshaped(b, node, y, kept)?;
    }
    Ok(y)
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

/// The field a layer is named after: its weight's initializer (`fc1.weight` → `fc1`,
/// `blocks.0.fc.weight` → `blocks_0_fc`) or, for a layer without one, its node
/// (`/pool1/MaxPool` → `pool1`); the layer's kind and position where the name says
/// nothing (`onnx::MatMul_12`, `/MaxPool`): `max_pool1` for the first unnamed
/// `MaxPool2d` (`same_kind` layers of its kind come before it).
fn field_name(named_after: &str, kind: &str, same_kind: usize) -> String {
    let mut snake = String::new();
    for (i, c) in kind.trim_end_matches("2d").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    let fallback = format!("{snake}{}", same_kind + 1);
    let stem = named_after.strip_suffix(".weight").unwrap_or(named_after);
    // A node name `/pool1/MaxPool`: the scope before the op's own name.
    let stem = match stem.rsplit_once('/') {
        Some((scope, _)) => scope.trim_start_matches('/'),
        None => stem,
    };
    if stem.contains("::") || stem.starts_with("onnx") || stem.is_empty() {
        return fallback;
    }
    identifier(stem, &fallback)
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

/// Names given out in one scope (fields, or the forward pass's locals).
#[derive(Default)]
struct Names {
    taken: HashSet<String>,
    /// The next suffix to try for each name asked for: every `name_k` below it is
    /// taken, so a thousand layers of one name cost a thousand steps, not a million.
    next: HashMap<String, usize>,
}

impl Names {
    /// A scope where `names` are taken already.
    fn taken(names: impl IntoIterator<Item = String>) -> Self {
        Self {
            taken: names.into_iter().collect(),
            next: HashMap::new(),
        }
    }

    /// `name`, or `name_2`, `name_3`… where it is taken; then taken.
    fn unique(&mut self, name: String) -> String {
        if self.taken.insert(name.clone()) {
            return name;
        }
        let n = self.next.entry(name.clone()).or_insert(2);
        loop {
            let candidate = format!("{name}_{n}");
            *n += 1;
            if self.taken.insert(candidate.clone()) {
                return candidate;
            }
        }
    }
}

/// The model name of a file stem: `mlp` → `Mlp`, `resnet-18` → `Resnet18`; a name
/// the generated source needs for something else (`self` → `Self`, `linear` →
/// `Linear`) gets `Model` after it.
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
        _ if is_reserved_name(&out) => format!("{out}Model"),
        _ => out,
    }
}

/// Type names the generated source already uses or Rust reserves: a model of one of
/// these names would not compile (`pub struct Self`) or would shadow what its own
/// fields and signature mean (`pub struct Tensor`, `pub struct Linear`).
fn is_reserved_name(name: &str) -> bool {
    ["Self", "Tensor", "Dyn", "Param"].contains(&name) || LayerSpec::NAMES.contains(&name)
}

/// `name` if it can name the generated struct: a Rust type name (a capital letter,
/// then letters, digits or `_`) that the generated source does not need for
/// something else.
fn check_model_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let form = chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !form {
        return Err(ImportError::Feature(format!(
            "`{name}` is not a model name (a Rust type name: a capital letter, then letters, digits or _)"
        )));
    }
    if is_reserved_name(name) {
        return Err(ImportError::Feature(format!(
            "`{name}` cannot name the model: Rust or the generated source uses it for something else (try `{name}Model`)"
        )));
    }
    Ok(())
}

/// `text` from the file (its name, producer, value names) as it may appear in a
/// generated comment: every character outside printable ASCII escaped (`\n`,
/// `\u{2028}`), and backquotes and backslashes too, so nothing it holds can end the
/// comment, start a line of code, or hide from a reader (bidirectional overrides).
fn comment_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            ' '..='~' if c != '`' && c != '\\' => out.push(c),
            // Not `\``: a backslash escapes nothing inside a Markdown code span.
            '`' => out.push_str("\\u{60}"),
            _ => out.extend(c.escape_default()),
        }
    }
    out
}

/// The input's dims: fixed ones as literals, symbolic ones as `const` parameters
/// (`batch` → `BATCH`, pushed to `params` once each).
fn input_dims(name: &str, dims: Option<&[Dim]>, params: &mut Vec<String>) -> Result<Vec<SDim>> {
    let dims =
        dims.ok_or_else(|| ImportError::Feature(format!("the input `{name}` declares no shape")))?;
    if dims.is_empty() {
        return Err(ImportError::Feature(format!(
            "the input `{name}` is a scalar"
        )));
    }
    let mut param = |p: String| {
        if !params.contains(&p) {
            params.push(p.clone());
        }
        SDim::param(&p)
    };
    Ok(dims
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Dim::Fixed(n) => SDim::lit(*n),
            Dim::Named(s) => param(identifier(s, &format!("d{i}")).to_ascii_uppercase()),
            Dim::Unknown => param(format!("D{i}")),
        })
        .collect())
}

/// The translated dims of an output checked against its declaration.
fn check_declared(name: &str, declared: &[Dim], dims: &[SDim]) -> Result<()> {
    let fits = declared.len() == dims.len()
        && declared.iter().zip(dims).all(|(d, s)| match d {
            Dim::Fixed(a) => s.as_lit() == Some(*a),
            _ => true,
        });
    if fits {
        Ok(())
    } else {
        Err(ImportError::Invalid(format!(
            "the output `{name}` is declared {declared:?} but computes [{}]",
            list(dims)
        )))
    }
}

/// Dims as a type's argument list: `BATCH, 4`.
fn list(dims: &[SDim]) -> String {
    dims.iter()
        .map(SDim::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The generated file.
fn source(
    name: &str,
    file: &str,
    graph: &Graph,
    params: &[String],
    (arg, input): (&str, &str),
    b: &Translator,
    (result, result_dims): (&Expr, &[SDim]),
) -> String {
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
        format!("{}, ", comment_text(&graph.producer))
    };
    let file = comment_text(file);
    let mut s = format!(
        "// `{name}`, imported from `{file}` ({producer}ONNX opset {}) by kiln-import.\n\nuse kiln::prelude::*;\n\n",
        graph.opset
    );
    s += &format!("/// The model of `{file}`.\n#[model]\npub struct {name} {{\n");
    for (field, ty) in &b.fields {
        s += &format!("    {field}: {ty},\n");
    }
    s += "}\n\n#[model]\n";
    s += &format!("impl {name} {{\n");
    s += &format!(
        "    /// The graph's output `{}` of its input `{}`.\n",
        comment_text(&graph.outputs[0].name),
        comment_text(&graph.inputs[0].name)
    );
    let output = list(result_dims);
    let signature = format!(
        "    pub fn forward{generics}(&self, {arg}: Tensor<{input}>) -> Tensor<{output}> {{\n"
    );
    // Wrapped as rustfmt wraps a signature past 100 columns.
    s += &if signature.len() <= 101 {
        signature
    } else {
        format!("    pub fn forward{generics}(\n        &self,\n        {arg}: Tensor<{input}>,\n    ) -> Tensor<{output}> {{\n")
    };
    for (name, code) in &b.lets {
        s += &format!("        let {name} = {};\n", chain_lines(code));
    }
    s += &format!(
        "        {}\n    }}\n}}\n",
        chain_lines(without_outer_parens(&result.code))
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permuted_tensor_reads_each_element_from_its_place() {
        // [2, 3, 4] holding its own flat index, axes reordered to [4, 2, 3].
        let t = Tensor {
            dims: vec![2, 3, 4],
            data: TensorData::F32((0..24).map(|i| i as f32).collect()),
        };
        let p = permuted(&t, &[2, 0, 1]).unwrap();
        assert_eq!(p.dims, vec![4, 2, 3]);
        let TensorData::F32(v) = p.data else {
            unreachable!()
        };
        for (k, i, j) in
            (0..4).flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (k, i, j))))
        {
            assert_eq!(v[k * 6 + i * 3 + j], (i * 12 + j * 4 + k) as f32);
        }
        assert!(permuted(&t, &[0, 0, 1]).is_none());
        assert!(permuted(&t, &[0, 1]).is_none());
    }

    #[test]
    fn layer_hints_drop_the_block_they_are_in() {
        assert_eq!(local_hint("blocks_layers_0_self_attn"), "self_attn");
        assert_eq!(local_hint("qkv_0"), "qkv_0");
        assert_eq!(local_hint("fc1"), "fc1");
    }
}
