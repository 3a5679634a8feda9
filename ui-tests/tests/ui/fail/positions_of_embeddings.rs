// A position table reads how many positions to embed from the token ids [B, T]; given
// the embeddings [B, T, D] it would read D. Refused, saying to pass the ids.

use kiln::prelude::*;

#[model]
struct Gpt {
    tok: Embedding<100, 32>,
    pos: Embedding<64, 32>,
}

#[model]
impl Gpt {
    fn forward<const B: usize, const T: usize>(&self, ids: Tensor<B, T, i32>) -> Tensor<B, T, 32> {
        let h = self.tok(ids);
        h + self.pos.positions(h)
    }
}

fn main() {}
