//! Materialising lazy tensors: the pending nodes a read needs are collected into an op
//! graph, its sizes made symbolic, and the graph planned by `kiln_fusion::plan` and run
//! by a `kiln_fusion::Program` — the planner and executor the `#[model]` path uses at
//! build time. Programs are cached by the graph's structure, so a step that records
//! the same ops again (at any batch size or sequence length the plan describes) skips
//! planning and reuses the program's buffers and the backend's compiled kernels.
//!
//! How a graph becomes a cache key: every size of its inputs above 1 becomes a run-time
//! size (equal sizes share one), the dims inside ops are written with those sizes
//! where they match (a reshape's other new size is left for the run to solve from the
//! element count), random ops' seeds become indices into a per-run seed table, and the
//! `1/n` of a mean stays symbolic. Two graphs with one key differ only in those sizes
//! and seeds, so the cached plan computes either exactly; anything else — another op,
//! constant, axis, slice bound, dtype or output set — is another key.

use crate::lazy::{Kind, LazyTensor};
use crate::replay::{self, Lengths};
use kiln_fusion::{plan, Program, RunContext, SDim, Seeds};
use kiln_tensor::ir::{Graph, Node as IrNode, NodeId, NodeKind};
use kiln_tensor::{Backend, Builder, Eager, Error, Op, RawTensor, Result, SymDim, TensorMeta};
use rustc_hash::{FxHashMap as HashMap, FxHasher};
use std::any::Any;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the run-time plan cache of one backend has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Materialisations whose graph had a cached program.
    pub hits: u64,
    /// Materialisations that planned a new program.
    pub misses: u64,
    /// Programs dropped to keep the cache within its capacity.
    pub evictions: u64,
    /// Programs in the cache now.
    pub programs: usize,
    /// Time spent planning new programs.
    pub planning: Duration,
    /// Time the first run of each new program took (kernels compiled there).
    pub first_runs: Duration,
    /// Programs captured as graphs at one set of input sizes (see [`crate::replay`]).
    pub captures: u64,
    /// Materialisations that replayed a captured graph instead of launching kernels.
    pub replays: u64,
}

impl std::fmt::Display for CacheStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} hits, {} misses, {} evictions, {} programs, {} captures, {} replays; planning {:.1} ms, first runs {:.1} ms",
            self.hits,
            self.misses,
            self.evictions,
            self.programs,
            self.captures,
            self.replays,
            self.planning.as_secs_f64() * 1e3,
            self.first_runs.as_secs_f64() * 1e3
        )
    }
}

/// The number of programs a backend's cache keeps by default.
pub const DEFAULT_CAPACITY: usize = 256;

struct Entry<B: Backend> {
    hash: u64,
    graph: Graph<SDim>,
    outputs: Vec<NodeId>,
    device: B::Device,
    program: Program<B>,
    /// Its captures, per set of input sizes (on backends that capture).
    lengths: Lengths<B>,
    last_used: u64,
}

/// The programs of one backend, most recently used kept.
struct Cache<B: Backend> {
    entries: Vec<Entry<B>>,
    capacity: usize,
    clock: u64,
    stats: CacheStats,
}

impl<B: Backend> Cache<B> {
    fn new() -> Self {
        Cache {
            entries: Vec::new(),
            capacity: DEFAULT_CAPACITY,
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    fn evict_to(&mut self, capacity: usize) {
        while self.entries.len() > capacity {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last_used)
                .expect("not empty");
            self.entries.swap_remove(oldest);
            self.stats.evictions += 1;
        }
    }
}

/// One cache per backend type, created on first use.
static CACHES: Mutex<Vec<Arc<dyn Any + Send + Sync>>> = Mutex::new(Vec::new());

fn cache<B: Backend>() -> Arc<Mutex<Cache<B>>> {
    let mut all = CACHES.lock().unwrap_or_else(|e| e.into_inner());
    for c in all.iter() {
        if let Ok(c) = c.clone().downcast::<Mutex<Cache<B>>>() {
            return c;
        }
    }
    let c = Arc::new(Mutex::new(Cache::<B>::new()));
    all.push(c.clone());
    c
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What backend `B`'s plan cache has done so far.
pub fn cache_stats<B: Backend>() -> CacheStats {
    let c = cache::<B>();
    let c = lock(&c);
    CacheStats {
        programs: c.entries.len(),
        ..c.stats
    }
}

/// Empties backend `B`'s plan cache and zeroes its counters.
pub fn clear_cache<B: Backend>() {
    let c = cache::<B>();
    let mut c = lock(&c);
    c.entries.clear();
    c.stats = CacheStats::default();
}

/// Sets how many programs backend `B`'s cache keeps (least recently used go first).
pub fn set_cache_capacity<B: Backend>(capacity: usize) -> Result<()> {
    if capacity == 0 {
        return Err(Error::invalid(
            "set_cache_capacity",
            "the plan cache must hold at least one program",
        ));
    }
    let c = cache::<B>();
    let mut c = lock(&c);
    c.capacity = capacity;
    c.evict_to(capacity);
    Ok(())
}

/// A write to perform when the next materialisation runs: `value` (pending) is
/// computed with it and handed to `store` (a batch-norm layer's running statistics).
pub(crate) struct PendingWrite<B: Backend> {
    pub(crate) value: LazyTensor<B>,
    pub(crate) store: Box<dyn FnOnce(RawTensor<B>) + Send>,
}

/// Pending writes, per backend type.
static WRITES: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());

/// Queues a write for the next materialisation on `B`.
pub(crate) fn defer_write<B: Backend>(write: PendingWrite<B>) {
    lock(&WRITES).push(Box::new(write));
}

fn take_writes<B: Backend>() -> Vec<PendingWrite<B>> {
    let mut all = lock(&WRITES);
    let mut mine = Vec::new();
    let mut rest = Vec::new();
    for w in all.drain(..) {
        match w.downcast::<PendingWrite<B>>() {
            Ok(w) => mine.push(*w),
            Err(w) => rest.push(w),
        }
    }
    *all = rest;
    mine
}

/// Computes every pending value that `tensors` need, in one planned program per device
/// (and what is deferred: a layer's running statistics).
pub fn eval<B: Backend>(tensors: &[&LazyTensor<B>]) -> Result<()> {
    let writes = take_writes::<B>();
    let mut targets: Vec<LazyTensor<B>> = tensors.iter().map(|&t| t.clone()).collect();
    targets.extend(writes.iter().map(|w| w.value.clone()));
    let mut devices: Vec<B::Device> = Vec::new();
    for t in &targets {
        if !devices.contains(&t.0.device) {
            devices.push(t.0.device.clone());
        }
    }
    for device in devices {
        let mine: Vec<LazyTensor<B>> = targets
            .iter()
            .filter(|t| t.0.device == device)
            .cloned()
            .collect();
        eval_on(&device, mine)?;
    }
    for w in writes {
        let v = w
            .value
            .state()
            .value
            .clone()
            .ok_or_else(|| Error::invalid("eval", "a deferred write was not computed"))?;
        (w.store)(v);
    }
    Ok(())
}

/// A graph recorded for one materialisation, in the cache's symbolic form.
struct Recorded<B: Backend> {
    graph: Graph<SDim>,
    /// The graph's leaves, in order, and their values.
    leaves: Vec<NodeId>,
    values: Vec<RawTensor<B>>,
    /// The graph nodes to write back, and the lazy tensors they belong to.
    outputs: Vec<NodeId>,
    computed: Vec<LazyTensor<B>>,
    /// The seed of each random op, by the index its op now holds.
    seeds: Vec<u64>,
    hash: u64,
}

/// Turns concrete sizes into the key's symbolic ones.
#[derive(Default)]
struct Sizes {
    /// `(value, atom)` for each distinct size of the inputs above 1, and for the sizes
    /// reshapes introduce.
    atoms: Vec<(usize, u32)>,
}

impl Sizes {
    fn find(&self, v: usize) -> Option<SDim> {
        self.atoms
            .iter()
            .find(|(size, _)| *size == v)
            .map(|(_, a)| SDim::runtime(*a))
    }

    fn fresh(&mut self, v: usize) -> SDim {
        let a = self.atoms.len() as u32;
        self.atoms.push((v, a));
        SDim::runtime(a)
    }

    /// An input's size: its atom (new or shared), or a literal 0 or 1.
    fn input(&mut self, v: usize) -> SDim {
        if v <= 1 {
            return SDim::lit(v);
        }
        self.find(v).unwrap_or_else(|| self.fresh(v))
    }

    /// A size inside the graph: the input size it equals, else a product of two or
    /// three of them (a flattened batch, a mean's count), else a literal.
    fn inner(&self, v: usize) -> SDim {
        if v <= 1 {
            return SDim::lit(v);
        }
        if let Some(s) = self.find(v) {
            return s;
        }
        let big: Vec<&(usize, u32)> = self
            .atoms
            .iter()
            .filter(|(s, _)| v.is_multiple_of(*s))
            .collect();
        for (i, &&(a, ia)) in big.iter().enumerate() {
            for &&(b, ib) in &big[i..] {
                if a.checked_mul(b) == Some(v) {
                    return SDim::runtime(ia).mul(&SDim::runtime(ib));
                }
                for &&(c, ic) in &big[i..] {
                    if a.checked_mul(b).and_then(|ab| ab.checked_mul(c)) == Some(v) {
                        return SDim::runtime(ia)
                            .mul(&SDim::runtime(ib))
                            .mul(&SDim::runtime(ic));
                    }
                }
            }
        }
        SDim::lit(v)
    }
}

/// Collects the pending nodes `targets` need (inputs first) and writes the graph.
fn record<B: Backend>(targets: &[LazyTensor<B>]) -> Result<Option<Recorded<B>>> {
    // Post-order walk over pending nodes; computed ones are the graph's leaves.
    let mut order: Vec<LazyTensor<B>> = Vec::new();
    let mut index: HashMap<u64, NodeId> = HashMap::default();
    let mut stack: Vec<(LazyTensor<B>, bool)> =
        targets.iter().map(|t| (t.clone(), false)).collect();
    let mut pending_inputs: HashMap<u64, Vec<LazyTensor<B>>> = HashMap::default();
    while let Some((t, expanded)) = stack.pop() {
        if index.contains_key(&t.0.id) {
            continue;
        }
        if expanded {
            index.insert(t.0.id, order.len());
            order.push(t);
            continue;
        }
        let state = t.state();
        if state.value.is_some() {
            drop(state);
            index.insert(t.0.id, order.len());
            order.push(t);
            continue;
        }
        let inputs = state.inputs.clone();
        drop(state);
        stack.push((t.clone(), true));
        for x in inputs.iter().rev() {
            if !index.contains_key(&x.0.id) {
                stack.push((x.clone(), false));
            }
        }
        pending_inputs.insert(t.0.id, inputs);
    }
    if pending_inputs.is_empty() {
        return Ok(None);
    }
    // Uses of each node by the pending nodes recorded here.
    let mut uses: HashMap<u64, usize> = HashMap::default();
    for ins in pending_inputs.values() {
        for x in ins {
            *uses.entry(x.0.id).or_default() += 1;
        }
    }
    let target_ids: Vec<u64> = targets.iter().map(|t| t.0.id).collect();
    let mut sizes = Sizes::default();
    let mut graph = Graph::<SDim>::new();
    let mut leaves = Vec::new();
    let mut values = Vec::new();
    let mut seeds = Vec::new();
    let mut hasher = FxHasher::default();
    for t in &order {
        let node = &t.0;
        let id = graph.nodes.len();
        let Some(ins) = pending_inputs.get(&node.id) else {
            let value = t
                .state()
                .value
                .clone()
                .expect("computed nodes hold a value");
            let dims: Vec<SDim> = node.meta.dims.iter().map(|&d| sizes.input(d)).collect();
            graph.nodes.push(IrNode {
                kind: NodeKind::Leaf(leaves.len()),
                inputs: vec![],
                meta: TensorMeta::new(dims, node.meta.dtype),
            });
            leaves.push(id);
            values.push(value);
            continue;
        };
        let inputs: Vec<NodeId> = ins.iter().map(|x| index[&x.0.id]).collect();
        let kind = match &node.kind {
            Kind::Source => unreachable!("sources hold a value"),
            Kind::RecipDim(n) => NodeKind::RecipDim(sizes.inner(*n)),
            Kind::Op(op) => NodeKind::Op(abstract_op(op, &mut sizes, &mut seeds)?),
        };
        let dims: Vec<SDim> = node.meta.dims.iter().map(|&d| sizes.inner(d)).collect();
        graph.nodes.push(IrNode {
            kind,
            inputs,
            meta: TensorMeta::new(dims, node.meta.dtype),
        });
    }
    // Outputs: the targets, and pending nodes that something outside this graph holds
    // (a variable the caller keeps, a node recorded later): computing them now saves
    // computing them again.
    let mut outputs = Vec::new();
    let mut computed = Vec::new();
    for t in &order {
        if !pending_inputs.contains_key(&t.0.id) {
            continue;
        }
        let internal = uses.get(&t.0.id).copied().unwrap_or(0);
        // Held here once (`order`); each use by a recorded node holds it twice (that
        // node's inputs and their copy in `pending_inputs`).
        let held_outside = Arc::strong_count(&t.0) > 1 + 2 * internal;
        if target_ids.contains(&t.0.id) || held_outside {
            outputs.push(index[&t.0.id]);
            computed.push(t.clone());
        }
    }
    for n in &graph.nodes {
        node_hash(n, &mut hasher);
    }
    outputs.hash(&mut hasher);
    Ok(Some(Recorded {
        graph,
        leaves,
        values,
        outputs,
        computed,
        seeds,
        hash: hasher.finish(),
    }))
}

/// `op` with its sizes written symbolically and its seed replaced by its index.
fn abstract_op(op: &Op, sizes: &mut Sizes, seeds: &mut Vec<u64>) -> Result<Op<SDim>> {
    Ok(match op {
        Op::Reshape { dims } => {
            // One new size of a reshape is solved from the element count at run time.
            let known: Vec<SDim> = dims.iter().map(|&d| sizes.inner(d)).collect();
            let open = known
                .iter()
                .zip(dims)
                .position(|(s, &d)| d > 1 && s.as_lit().is_some());
            let mut out = known;
            if let Some(i) = open {
                out[i] = sizes.fresh(dims[i]);
            }
            Op::Reshape { dims: out }
        }
        op => {
            let abstracted = op.try_map_dims(|&d| Ok(sizes.inner(d)))?;
            match op.seed() {
                // Draws take their seed from the run's table: one program, fresh masks.
                Some(own) => {
                    seeds.push(own);
                    abstracted.with_seed(seeds.len() as u64 - 1)
                }
                None => abstracted,
            }
        }
    })
}

/// Feeds a node's structure to the key's hash: its kind (an op by name), inputs, dims
/// and dtype. Ops that differ only in their parameters (an axis, a constant) hash
/// alike; a hit is confirmed by comparing whole graphs, so that costs a comparison,
/// never a wrong program.
fn node_hash(n: &IrNode<SDim>, h: &mut impl Hasher) {
    match &n.kind {
        NodeKind::Leaf(k) => (0u8, *k).hash(h),
        NodeKind::RecipDim(d) => (1u8, d).hash(h),
        NodeKind::Op(op) => (2u8, op.name()).hash(h),
        NodeKind::Call(k) | NodeKind::CallGrad(k) => (3u8, *k).hash(h),
    }
    n.inputs.hash(h);
    n.meta.dims.hash(h);
    n.meta.dtype.hash(h);
}

fn eval_on<B: Backend>(device: &B::Device, targets: Vec<LazyTensor<B>>) -> Result<()> {
    let Some(rec) = record(&targets)? else {
        return Ok(());
    };
    drop(targets);
    let cache = cache::<B>();
    let mut c = lock(&cache);
    c.clock += 1;
    let clock = c.clock;
    let found = c.entries.iter().position(|e| {
        e.hash == rec.hash
            && e.device == *device
            && e.outputs == rec.outputs
            && e.graph == rec.graph
    });
    let inputs: Vec<&RawTensor<B>> = rec.values.iter().collect();
    let at = match found {
        Some(i) => {
            c.stats.hits += 1;
            i
        }
        None => {
            let start = Instant::now();
            let p = plan(&rec.graph, &rec.leaves, &rec.outputs);
            let planned = start.elapsed();
            c.stats.misses += 1;
            c.stats.planning += planned;
            log::debug!(
                "kiln-dynamic: plan cache miss on {}: {} nodes -> {} kernels, planned in {:.2} ms ({} programs cached)",
                B::device_name(device),
                rec.graph.nodes.len(),
                p.kernels.len(),
                planned.as_secs_f64() * 1e3,
                c.entries.len(),
            );
            let capacity = c.capacity;
            c.evict_to(capacity - 1);
            c.entries.push(Entry {
                hash: rec.hash,
                graph: rec.graph,
                outputs: rec.outputs.clone(),
                device: device.clone(),
                program: Program::new(p, &[]),
                lengths: Lengths::default(),
                last_used: clock,
            });
            c.entries.len() - 1
        }
    };
    let first = found.is_none();
    let start = Instant::now();
    let Cache { entries, stats, .. } = &mut *c;
    let entry = &mut entries[at];
    entry.last_used = clock;
    // A replay would repeat the draws of the run it captured.
    let results = if rec.seeds.is_empty() && replay::applies::<B>(device) {
        replay::run(
            &mut entry.lengths,
            &mut entry.program,
            stats,
            device,
            &inputs,
        )?
    } else {
        run_plain(&mut entry.program, device, &rec.seeds, &inputs)?
    };
    if first {
        c.stats.first_runs += start.elapsed();
    }
    drop(c);
    for (t, v) in rec.computed.iter().zip(results) {
        store(t, v);
    }
    Ok(())
}

/// Runs `program` on `inputs`, random ops drawing with `seeds` (indexed by the seeds
/// their ops hold), launching its kernels.
pub(crate) fn run_plain<B: Backend>(
    program: &mut Program<B>,
    device: &B::Device,
    seeds: &[u64],
    inputs: &[&RawTensor<B>],
) -> Result<Vec<RawTensor<B>>> {
    let mut cx = RunContext::new(device).seeds(Seeds::Table(seeds));
    let planned = (program.run(&mut cx, inputs)?).map(|outputs| outputs.collect());
    match planned {
        Some(outputs) => Ok(outputs),
        // The key fixes every size the plan names, so this is a broken invariant; the
        // op-by-op run still computes the right values.
        None => program.run_op_by_op(&mut cx, inputs),
    }
}

/// Keeps a computed value; a node that needs no gradient lets go of its inputs.
fn store<B: Backend>(t: &LazyTensor<B>, value: RawTensor<B>) {
    let mut state = t.state();
    state.value = Some(value);
    if !t.0.requires_grad {
        state.inputs.clear();
    }
}

/// Computes one node at once from its inputs' values with the eager executor (see
/// [`crate::set_eager`]).
pub(crate) fn eval_op_by_op<B: Backend>(t: &LazyTensor<B>) -> Result<()> {
    let inputs = t.state().inputs.clone();
    let values = inputs
        .iter()
        .map(|x| x.value())
        .collect::<Result<Vec<RawTensor<B>>>>()?;
    let refs: Vec<&RawTensor<B>> = values.iter().collect();
    let mut eager = Eager::<B>::new(t.0.device.clone());
    let value = match &t.0.kind {
        Kind::Source => return Ok(()),
        Kind::Op(op) => eager.apply(op.clone(), &refs)?,
        Kind::RecipDim(n) => eager.apply(Op::recip_count(*n, t.0.meta.dtype), &[])?,
    };
    if kiln_tensor::anomaly::detecting() {
        check_finite(t, &inputs, &values, &value)?;
    }
    store(t, value);
    Ok(())
}

/// Anomaly mode's check of node `t`'s `value`, computed from `inputs` (whose values
/// are `values`): an error naming the op, or the input that held a value that is not
/// finite, with the named parameters nearest upstream (its layer).
fn check_finite<B: Backend>(
    t: &LazyTensor<B>,
    inputs: &[LazyTensor<B>],
    values: &[RawTensor<B>],
    value: &RawTensor<B>,
) -> Result<()> {
    use kiln_tensor::anomaly::{first_non_finite, given_error, op_error};
    let Some(bad) = first_non_finite(value)? else {
        return Ok(());
    };
    let op = match &t.0.kind {
        Kind::Op(op) => op.name(),
        _ => "1/n",
    };
    for (x, v) in inputs.iter().zip(values) {
        if let Some(held) = first_non_finite(v)? {
            let what = match x.name() {
                Some(n) => format!("`{n}`"),
                None => format!(
                    "an input of `{op}` ({} {})",
                    x.dtype(),
                    kiln_tensor::op::fmt_dims(x.dims())
                ),
            };
            return Err(given_error(&what, &held));
        }
    }
    let layer = match t.layer() {
        Some(layer) => format!(", in layer `{layer}`"),
        None => inputs
            .iter()
            .find_map(|x| x.layer())
            .map_or(String::new(), |layer| format!(", after layer `{layer}`")),
    };
    Err(op_error(
        &format!("`{op}`"),
        &bad,
        value.dtype(),
        value.dims().as_slice(),
        &format!("dynamic node {}{layer}", t.id()),
        &named_upstream(inputs),
        None,
    ))
}

/// The named leaves (parameters) nearest upstream of `inputs`: those within two steps
/// of the nearest (a layer's, behind the views that reshape them), breadth first
/// through the inputs nodes still hold.
fn named_upstream<B: Backend>(inputs: &[LazyTensor<B>]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut level: Vec<LazyTensor<B>> = inputs.to_vec();
    let mut found: Vec<String> = Vec::new();
    let mut levels_left: Option<usize> = None;
    while !level.is_empty() && levels_left != Some(0) {
        let mut next = Vec::new();
        for x in level {
            if !seen.insert(x.id()) {
                continue;
            }
            match x.name() {
                Some(n) => found.push(n.to_string()),
                None => next.extend(x.state().inputs.iter().cloned()),
            }
        }
        levels_left = match levels_left {
            None if !found.is_empty() => Some(2),
            left => left.map(|l| l - 1),
        };
        level = next;
    }
    found.sort();
    found.dedup();
    found
}
