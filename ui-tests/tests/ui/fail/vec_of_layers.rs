use kiln::prelude::*;

#[model]
struct Net {
    layers: Vec<Linear<8, 8>>,
    head: Linear<8, 2>,
}

fn main() {}
