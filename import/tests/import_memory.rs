//! An import's memory is linear in the file: a chain of four times as many nodes
//! costs about four times the memory, not sixteen. Measured by counting this test
//! binary's allocations (its only test, so nothing else allocates meanwhile).

use kiln_import::onnx;
use kiln_import::{decode, translate};
use prost::Message;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes held now and the most held since the
/// last [`reset_peak`].
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(held, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn reset_peak() {
    PEAK.store(HELD.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The MLP fixture with `n` elementwise ops chained after its output (ReLU, Neg,
/// Abs in turn), the last one the graph's output: its bytes.
fn chained_mlp(n: usize) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mlp.onnx");
    let mut m = onnx::ModelProto::decode(std::fs::read(path).unwrap().as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    let mut last = g.output[0].name().to_string();
    for i in 0..n {
        let out = format!("chain_{i}");
        g.node.push(onnx::NodeProto {
            input: vec![last],
            output: vec![out.clone()],
            name: Some(format!("/chain/{i}")),
            op_type: Some(["Relu", "Neg", "Abs"][i % 3].into()),
            ..Default::default()
        });
        last = out;
    }
    g.output[0].name = Some(last);
    m.encode_to_vec()
}

/// The most memory reading and translating `bytes` held at once, past what was held
/// before.
fn peak_of_import(bytes: &[u8]) -> usize {
    let before = HELD.load(Ordering::Relaxed);
    reset_peak();
    let graph = decode(bytes).unwrap();
    let translation = translate(&graph, "Chained", "chained.onnx").unwrap();
    assert!(translation.source.contains("pub fn forward"));
    drop((graph, translation));
    PEAK.load(Ordering::Relaxed) - before
}

#[test]
fn import_memory_is_linear_in_the_node_count() {
    let (small, large) = (chained_mlp(1500), chained_mlp(6000));
    let base = peak_of_import(&chained_mlp(0));
    let (small, large) = (peak_of_import(&small), peak_of_import(&large));
    let (grown_small, grown_large) = (small.saturating_sub(base), large.saturating_sub(base));
    assert!(grown_small > 0, "1500 more nodes cost no memory?");
    // Linear: about 4x. Quadratic (each value holding its whole chain's code): 16x.
    assert!(
        grown_large <= 6 * grown_small,
        "1500 chained nodes cost {grown_small} bytes, 6000 cost {grown_large}: more than linear"
    );
}
