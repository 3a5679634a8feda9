//! The [`Dataset`] trait, the [`Example`] it hands out (an input and a target, each a
//! [`Field`] of host values with its dims), and [`InMemory`], a dataset over tensors
//! already in memory.

use kiln_tensor::{DType, Error, Result};
use std::sync::Arc;

/// Values of one field, in the dtype the model takes.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Features, pixels, regression targets.
    F32(Vec<f32>),
    /// Class labels, token ids.
    I32(Vec<i32>),
}

impl Values {
    /// How many values.
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::I32(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Their dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Values::F32(_) => DType::F32,
            Values::I32(_) => DType::I32,
        }
    }
}

/// One tensor of one example, on the host: its dims (without the batch) and values.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// Dims of one example: `[784]`, `[3, 32, 32]`, `[]` for a class label.
    pub dims: Vec<usize>,
    /// Row-major values, as many as the dims hold.
    pub values: Values,
}

impl Field {
    /// A field of `values` with `dims` (an error if their counts differ).
    pub fn new(dims: Vec<usize>, values: Values) -> Result<Self> {
        let want = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if want != Some(values.len()) {
            return Err(Error::shape(
                "Field",
                format!(
                    "dims {dims:?} hold {want:?} values but {} were given",
                    values.len()
                ),
            ));
        }
        Ok(Field { dims, values })
    }

    /// A class label: an `i32` scalar.
    pub fn class(label: i32) -> Self {
        Field {
            dims: Vec::new(),
            values: Values::I32(vec![label]),
        }
    }

    /// A vector of `f32` features, dims `[len]`.
    pub fn features(values: Vec<f32>) -> Self {
        Field {
            dims: vec![values.len()],
            values: Values::F32(values),
        }
    }

    /// A sequence of token ids, dims `[len]`.
    pub fn tokens(ids: Vec<i32>) -> Self {
        Field {
            dims: vec![ids.len()],
            values: Values::I32(ids),
        }
    }
}

/// One example: what the model takes and what it should give.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// The model's input.
    pub input: Field,
    /// The target the loss compares against (a class, a value, the next tokens).
    pub target: Field,
}

/// Examples that can be read in any order: a folder of images, a CSV file, windows of
/// a text, tensors in memory, or a user's own. The loader reads it from worker
/// threads, hence `Send + Sync`.
pub trait Dataset: Send + Sync {
    /// How many examples.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Example `index` (below [`Dataset::len`]); a file that cannot be read is an error
    /// naming the file and, where it has them, the row.
    fn get(&self, index: usize) -> Result<Example>;
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<Example> {
        (**self).get(index)
    }
}

impl<D: Dataset + ?Sized> Dataset for Box<D> {
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<Example> {
        (**self).get(index)
    }
}

/// Examples held in memory: `inputs` and `targets` stacked along a first axis of the
/// examples (PyTorch's `TensorDataset` of two tensors).
#[derive(Clone, Debug)]
pub struct InMemory {
    inputs: Field,
    targets: Field,
    len: usize,
}

impl InMemory {
    /// A dataset of `inputs` (dims `[n, ..]`) and `targets` (dims `[n, ..]`): an error
    /// unless both have a first axis of the same length.
    pub fn new(inputs: Field, targets: Field) -> Result<Self> {
        let Some(&len) = inputs.dims.first() else {
            return Err(Error::shape(
                "InMemory",
                "the inputs need a first axis of examples, but they are a scalar",
            ));
        };
        if targets.dims.first() != Some(&len) {
            return Err(Error::shape(
                "InMemory",
                format!(
                    "{len} inputs (dims {:?}) but the targets have dims {:?}",
                    inputs.dims, targets.dims
                ),
            ));
        }
        Field::new(inputs.dims.clone(), inputs.values.clone())?;
        Field::new(targets.dims.clone(), targets.values.clone())?;
        Ok(InMemory {
            inputs,
            targets,
            len,
        })
    }
}

/// Example `i` of a field stacked along its first axis of `n` examples.
fn row(field: &Field, n: usize, i: usize) -> Field {
    let per = field.values.len() / n.max(1);
    let values = match &field.values {
        Values::F32(v) => Values::F32(v[i * per..(i + 1) * per].to_vec()),
        Values::I32(v) => Values::I32(v[i * per..(i + 1) * per].to_vec()),
    };
    Field {
        dims: field.dims[1..].to_vec(),
        values,
    }
}

impl Dataset for InMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Example> {
        check_index("InMemory", index, self.len)?;
        Ok(Example {
            input: row(&self.inputs, self.len, index),
            target: row(&self.targets, self.len, index),
        })
    }
}

/// Some of a dataset's examples, in a given order (PyTorch's `Subset`).
#[derive(Debug)]
pub struct Subset<D> {
    data: Arc<D>,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// Examples `indices` of `data`: an error naming the first index out of range.
    pub fn new(data: Arc<D>, indices: Vec<usize>) -> Result<Self> {
        if let Some(&i) = indices.iter().find(|&&i| i >= data.len()) {
            return Err(Error::invalid(
                "Subset",
                format!("index {i} of a dataset of {}", data.len()),
            ));
        }
        Ok(Subset { data, indices })
    }

    /// The indices into the whole dataset, in this subset's order.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn get(&self, index: usize) -> Result<Example> {
        check_index("Subset", index, self.indices.len())?;
        self.data.get(self.indices[index])
    }
}

/// `data` split at random into parts of `sizes` examples (they must add up to its
/// length), the same parts for the same `seed` (PyTorch's `random_split`).
pub fn random_split<D: Dataset>(data: D, sizes: &[usize], seed: u64) -> Result<Vec<Subset<D>>> {
    let total = sizes.iter().try_fold(0usize, |t, &n| t.checked_add(n));
    if total != Some(data.len()) {
        let total = total.map_or("more than a usize holds".to_string(), |t| t.to_string());
        return Err(Error::invalid(
            "random_split",
            format!(
                "parts of {sizes:?} add up to {total}, not the dataset's {}",
                data.len()
            ),
        ));
    }
    let order = crate::loader::shuffled(data.len(), seed, u64::MAX);
    let data = Arc::new(data);
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            let part = Subset::new(data.clone(), order[start..start + n].to_vec());
            start += n;
            part
        })
        .collect()
}

/// An error unless `index` is below `len`.
pub(crate) fn check_index(what: &str, index: usize, len: usize) -> Result<()> {
    if index >= len {
        return Err(Error::invalid(
            "Dataset::get",
            format!("{what}: example {index} of a dataset of {len}"),
        ));
    }
    Ok(())
}
