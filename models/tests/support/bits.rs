//! A module's parameters and buffers by name, as bits: what "bit for bit" compares
//! (so -0.0, NaN payloads and subnormals count).

use kiln::cpu::Cpu;
use kiln::tensor::nn::{Module, Slot};

/// Every f32 parameter and buffer of `m`, by name, as bits.
pub fn bits<M: Module<Cpu>>(m: &M) -> Vec<(String, Vec<u32>)> {
    let mut out = Vec::new();
    let mut push = |s: Slot<'_, Cpu>| {
        let v = s.value.to_vec::<f32>().unwrap();
        out.push((
            s.name.to_string(),
            v.into_iter().map(f32::to_bits).collect(),
        ));
    };
    m.visit_params("", &mut push);
    m.visit_buffers("", &mut push);
    out
}
