//! An ONNX file read without trusting it: decoded from protobuf, then checked into a
//! [`Graph`] whose nodes are in an order where every value is produced before it is
//! read, whose initializers hold exactly the values their dims declare, and whose opset
//! is one Kiln imports. Nothing is allocated by a declared size before the data behind
//! it has been seen, so a hostile file costs at most memory in proportion to its length.

use crate::error::{ImportError, Result};
use crate::onnx;
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// The oldest ONNX opset Kiln imports.
pub const MIN_OPSET: i64 = 13;
/// The newest ONNX opset Kiln imports.
pub const MAX_OPSET: i64 = 21;
/// The largest file read: protobuf's own limit on a message.
pub const MAX_FILE_BYTES: u64 = 2 << 30;

/// A checked ONNX graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// The model's ONNX opset (its `ai.onnx` import).
    pub opset: i64,
    /// Who wrote the file (`pytorch 2.5`), for messages.
    pub producer: String,
    /// The model's inputs (graph inputs that are not initializers), in order.
    pub inputs: Vec<Value>,
    /// The model's outputs, in order.
    pub outputs: Vec<Value>,
    /// The initializers (weights and constants) by name, shared so that a copy of the
    /// graph does not copy its weights.
    pub initializers: BTreeMap<String, Arc<Tensor>>,
    /// The nodes, each after every node whose output it reads.
    pub nodes: Vec<Node>,
}

/// A graph input or output as the file declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// Its name in the graph.
    pub name: String,
    /// Its element type, where declared and one Kiln holds.
    pub dtype: Option<ElementType>,
    /// Its dims, where declared.
    pub dims: Option<Vec<Dim>>,
}

/// One dim of a declared shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A symbolic size (`batch`, `sequence`), the same wherever the name recurs.
    Named(String),
    /// A size the file leaves open.
    Unknown,
}

/// The element types Kiln imports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit integer.
    I32,
    /// 64-bit integer (ONNX's index type).
    I64,
    /// Boolean.
    Bool,
}

impl ElementType {
    /// The type of ONNX's `TensorProto.DataType` code, `None` for one Kiln does not hold.
    fn from_code(code: i32) -> Option<Self> {
        use onnx::tensor_proto::DataType as D;
        match D::try_from(code).ok()? {
            D::Float => Some(Self::F32),
            D::Double => Some(Self::F64),
            D::Int32 => Some(Self::I32),
            D::Int64 => Some(Self::I64),
            D::Bool => Some(Self::Bool),
            _ => None,
        }
    }

    /// Bytes per element in `raw_data`.
    fn size(self) -> usize {
        match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::Bool => 1,
        }
    }
}

/// A node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Its name (`/fc1/Gemm`), or `#<position>` where the file gives none.
    pub name: String,
    /// Its op (`Gemm`), prefixed by its domain where that is not ONNX's own.
    pub op: String,
    /// The values it reads (an empty name: an optional input left out).
    pub inputs: Vec<String>,
    /// The values it produces.
    pub outputs: Vec<String>,
    /// Its attributes by name.
    pub attributes: BTreeMap<String, Attribute>,
}

/// A node attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum Attribute {
    /// A float.
    Float(f32),
    /// An integer.
    Int(i64),
    /// A string.
    String(String),
    /// A tensor (`Constant`'s value).
    Tensor(Tensor),
    /// Floats.
    Floats(Vec<f32>),
    /// Integers.
    Ints(Vec<i64>),
    /// Strings.
    Strings(Vec<String>),
    /// A kind Kiln does not import (a subgraph, a sparse tensor), named.
    Other(String),
}

/// A tensor held in the file (an initializer or a constant).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Its dims.
    pub dims: Vec<usize>,
    /// Its values, row-major.
    pub data: TensorData,
}

/// A held tensor's values.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// 64-bit integers.
    I64(Vec<i64>),
    /// Booleans.
    Bool(Vec<bool>),
}

impl TensorData {
    /// How many values it holds.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::F64(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::Bool(v) => v.len(),
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads and checks the ONNX model at `path`.
pub fn read(path: impl AsRef<Path>) -> Result<Graph> {
    decode(&file_bytes(path.as_ref())?)
}

/// Reads one serialised tensor (ONNX's test-data layout: `test_data_set_0/input_0.pb`).
pub fn read_tensor(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let bytes = file_bytes(path)?;
    let t = onnx::TensorProto::decode(bytes.as_slice())
        .map_err(|e| ImportError::NotOnnx(format!("`{}`: {e}", path.display())))?;
    tensor(&t, &format!("the tensor in `{}`", path.display()))
}

/// The bytes of the regular file at `path`, read no further than the size it had when
/// opened: a device (`/dev/zero`), a FIFO or a folder is refused by name rather than
/// read until memory runs out, and so is a file over protobuf's limit.
fn file_bytes(path: &Path) -> Result<Vec<u8>> {
    let io = |source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(ImportError::Feature(format!(
            "`{}` is not a regular file (a device, a FIFO or a folder): an ONNX model is read from a file",
            path.display()
        )));
    }
    let len = meta.len();
    if len > MAX_FILE_BYTES {
        return Err(ImportError::Feature(format!(
            "`{}` is {len} bytes, over protobuf's 2 GiB limit (a model with external data files is not imported)",
            path.display()
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len).read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

/// Checks the ONNX model in `bytes` (a file's contents).
pub fn decode(bytes: &[u8]) -> Result<Graph> {
    let model = onnx::ModelProto::decode(bytes).map_err(|e| ImportError::NotOnnx(e.to_string()))?;
    let opset = model_opset(&model)?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::Invalid("the model has no graph".into()))?;
    let mut initializers = BTreeMap::new();
    for t in &graph.initializer {
        let name = t.name().to_string();
        if name.is_empty() {
            return Err(ImportError::Invalid("an initializer has no name".into()));
        }
        let tensor = tensor(t, &format!("initializer `{name}`"))?;
        if initializers
            .insert(name.clone(), Arc::new(tensor))
            .is_some()
        {
            return Err(ImportError::Invalid(format!(
                "two initializers are named `{name}`"
            )));
        }
    }
    if let Some(s) = graph.sparse_initializer.first() {
        let name = s.values.as_ref().map_or("", |v| v.name());
        return Err(ImportError::Feature(format!(
            "sparse initializer `{name}` (sparse tensors are not imported)"
        )));
    }
    let inputs: Vec<Value> = graph
        .input
        .iter()
        .filter(|v| !initializers.contains_key(v.name()))
        .map(value)
        .collect::<Result<_>>()?;
    let outputs: Vec<Value> = graph.output.iter().map(value).collect::<Result<_>>()?;
    let nodes: Vec<Node> = graph
        .node
        .iter()
        .enumerate()
        .map(|(i, n)| node(i, n))
        .collect::<Result<_>>()?;
    let nodes = in_dependency_order(nodes, &inputs, &initializers)?;
    let produced: HashSet<&str> = nodes
        .iter()
        .flat_map(|n| n.outputs.iter().map(String::as_str))
        .chain(inputs.iter().map(|v| v.name.as_str()))
        .chain(initializers.keys().map(String::as_str))
        .collect();
    if let Some(missing) = outputs.iter().find(|o| !produced.contains(o.name.as_str())) {
        return Err(ImportError::Invalid(format!(
            "the graph's output `{}` is produced by no node, input or initializer",
            missing.name
        )));
    }
    Ok(Graph {
        opset,
        producer: format!("{} {}", model.producer_name(), model.producer_version())
            .trim()
            .to_string(),
        inputs,
        outputs,
        initializers,
        nodes,
    })
}

/// The model's `ai.onnx` opset, checked against the range Kiln imports.
fn model_opset(model: &onnx::ModelProto) -> Result<i64> {
    let ops = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain(), "" | "ai.onnx"))
        .ok_or_else(|| ImportError::Invalid("the model imports no `ai.onnx` opset".into()))?;
    let v = ops.version();
    if !(MIN_OPSET..=MAX_OPSET).contains(&v) {
        return Err(ImportError::Feature(format!(
            "opset {v} (Kiln imports opsets {MIN_OPSET} to {MAX_OPSET}; re-export with `opset_version` in that range)"
        )));
    }
    Ok(v)
}

/// A declared graph input or output.
fn value(v: &onnx::ValueInfoProto) -> Result<Value> {
    use onnx::tensor_shape_proto::dimension::Value as D;
    use onnx::type_proto::Value as T;
    let name = v.name().to_string();
    if name.is_empty() {
        return Err(ImportError::Invalid(
            "a graph input or output has no name".into(),
        ));
    }
    let Some(T::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Ok(Value {
            name,
            dtype: None,
            dims: None,
        });
    };
    let dims = match &t.shape {
        None => None,
        Some(shape) => Some(
            shape
                .dim
                .iter()
                .map(|d| match &d.value {
                    Some(D::DimValue(n)) => usize::try_from(*n).map(Dim::Fixed).map_err(|_| {
                        ImportError::Invalid(format!("`{name}` declares a dim of {n}"))
                    }),
                    Some(D::DimParam(p)) if !p.is_empty() => Ok(Dim::Named(p.clone())),
                    _ => Ok(Dim::Unknown),
                })
                .collect::<Result<_>>()?,
        ),
    };
    Ok(Value {
        dtype: t.elem_type.and_then(ElementType::from_code),
        name,
        dims,
    })
}

/// A node, its attributes decoded.
fn node(position: usize, n: &onnx::NodeProto) -> Result<Node> {
    let name = match n.name() {
        "" => format!("#{position}"),
        s => s.to_string(),
    };
    let op = match n.domain() {
        "" | "ai.onnx" => n.op_type().to_string(),
        d => format!("{d}.{}", n.op_type()),
    };
    if n.op_type().is_empty() {
        return Err(ImportError::Invalid(format!("node `{name}` has no op")));
    }
    let mut attributes = BTreeMap::new();
    for a in &n.attribute {
        let what = format!("attribute `{}` of node `{name}` ({op})", a.name());
        let value = attribute(a, &what)?;
        if attributes.insert(a.name().to_string(), value).is_some() {
            return Err(ImportError::Invalid(format!("{what} is given twice")));
        }
    }
    Ok(Node {
        name,
        op,
        inputs: n.input.clone(),
        outputs: n.output.clone(),
        attributes,
    })
}

/// A node attribute, by its declared type.
fn attribute(a: &onnx::AttributeProto, what: &str) -> Result<Attribute> {
    use onnx::attribute_proto::AttributeType as A;
    let text = |b: &[u8]| {
        String::from_utf8(b.to_vec())
            .map_err(|_| ImportError::Invalid(format!("{what} is not UTF-8")))
    };
    Ok(match a.r#type() {
        A::Float => Attribute::Float(a.f()),
        A::Int => Attribute::Int(a.i()),
        A::String => Attribute::String(text(a.s())?),
        A::Tensor => Attribute::Tensor(tensor(
            a.t.as_ref()
                .ok_or_else(|| ImportError::Invalid(format!("{what} holds no tensor")))?,
            what,
        )?),
        A::Floats => Attribute::Floats(a.floats.clone()),
        A::Ints => Attribute::Ints(a.ints.clone()),
        A::Strings => Attribute::Strings(a.strings.iter().map(|s| text(s)).collect::<Result<_>>()?),
        other => Attribute::Other(format!("{other:?}")),
    })
}

/// A held tensor, its declared dims checked against the values it holds.
fn tensor(t: &onnx::TensorProto, what: &str) -> Result<Tensor> {
    use onnx::tensor_proto::DataLocation;
    if t.data_location() == DataLocation::External {
        return Err(ImportError::Feature(format!(
            "{what} keeps its data in an external file (save the model with its data inside)"
        )));
    }
    let dims: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| ImportError::Invalid(format!("{what} declares dims {:?}", t.dims)))?;
    let count = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            ImportError::Invalid(format!(
                "{what} declares dims {dims:?}, too many values to hold"
            ))
        })?;
    let ty = ElementType::from_code(t.data_type()).ok_or_else(|| {
        let name = onnx::tensor_proto::DataType::try_from(t.data_type())
            .map_or_else(|_| format!("code {}", t.data_type()), |d| format!("{d:?}"));
        ImportError::Feature(format!(
            "{what} is of type {name} (Kiln imports f32, f64, i32, i64 and bool)"
        ))
    })?;
    let mismatch = |held: usize| {
        ImportError::Invalid(format!(
            "{what} declares dims {dims:?} ({count} values) but holds {held}"
        ))
    };
    let raw = t.raw_data();
    let data = if !raw.is_empty() || no_typed_values(t) {
        if raw.len()
            != count
                .checked_mul(ty.size())
                .ok_or_else(|| mismatch(raw.len() / ty.size()))?
        {
            return Err(mismatch(raw.len() / ty.size()));
        }
        from_raw(ty, raw)
    } else {
        let data = match ty {
            ElementType::F32 => TensorData::F32(t.float_data.clone()),
            ElementType::F64 => TensorData::F64(t.double_data.clone()),
            ElementType::I32 => TensorData::I32(t.int32_data.clone()),
            ElementType::I64 => TensorData::I64(t.int64_data.clone()),
            ElementType::Bool => TensorData::Bool(t.int32_data.iter().map(|&v| v != 0).collect()),
        };
        if data.len() != count {
            return Err(mismatch(data.len()));
        }
        data
    };
    Ok(Tensor { dims, data })
}

/// Whether a tensor holds no values in any typed field (its values, if any, are raw).
fn no_typed_values(t: &onnx::TensorProto) -> bool {
    t.float_data.is_empty()
        && t.double_data.is_empty()
        && t.int32_data.is_empty()
        && t.int64_data.is_empty()
}

/// Values from little-endian bytes whose length is a multiple of the element size.
fn from_raw(ty: ElementType, raw: &[u8]) -> TensorData {
    fn words<const N: usize, T>(raw: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        raw.chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks of N bytes")))
            .collect()
    }
    match ty {
        ElementType::F32 => TensorData::F32(words(raw, f32::from_le_bytes)),
        ElementType::F64 => TensorData::F64(words(raw, f64::from_le_bytes)),
        ElementType::I32 => TensorData::I32(words(raw, i32::from_le_bytes)),
        ElementType::I64 => TensorData::I64(words(raw, i64::from_le_bytes)),
        ElementType::Bool => TensorData::Bool(raw.iter().map(|&b| b != 0).collect()),
    }
}

/// `nodes` ordered so that each comes after every node whose output it reads; an
/// error names a value nothing produces, a value produced twice, or the nodes of a
/// cycle.
fn in_dependency_order(
    nodes: Vec<Node>,
    inputs: &[Value],
    initializers: &BTreeMap<String, Arc<Tensor>>,
) -> Result<Vec<Node>> {
    // Which node produces each value, and the values there from the start.
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let given: HashSet<&str> = inputs
        .iter()
        .map(|v| v.name.as_str())
        .chain(initializers.keys().map(String::as_str))
        .collect();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            if given.contains(o.as_str()) || producer.insert(o, i).is_some() {
                return Err(ImportError::Invalid(format!(
                    "value `{o}` is produced twice (node `{}` among them)",
                    n.name
                )));
            }
        }
    }
    // Each node's unmet inputs (by producing node); a value nobody produces is an error.
    let mut waiting = vec![0usize; nodes.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for input in n.inputs.iter().filter(|v| !v.is_empty()) {
            if given.contains(input.as_str()) {
                continue;
            }
            match producer.get(input.as_str()) {
                Some(&p) => {
                    waiting[i] += 1;
                    readers[p].push(i);
                }
                None => {
                    return Err(ImportError::Invalid(format!(
                    "node `{}` ({}) reads `{input}`, which no input, initializer or node produces",
                    n.name, n.op
                )))
                }
            }
        }
    }
    // Kahn's order, keeping the file's order among ready nodes.
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &r in &readers[i] {
            waiting[r] -= 1;
            if waiting[r] == 0 {
                ready.insert(r);
            }
        }
    }
    if order.len() < nodes.len() {
        let stuck: Vec<String> = (0..nodes.len())
            .filter(|&i| waiting[i] > 0)
            .take(8)
            .map(|i| format!("`{}` ({})", nodes[i].name, nodes[i].op))
            .collect();
        return Err(ImportError::Invalid(format!(
            "the graph has a cycle: nodes {} wait on each other",
            stuck.join(", ")
        )));
    }
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().expect("each node ordered once"))
        .collect())
}
