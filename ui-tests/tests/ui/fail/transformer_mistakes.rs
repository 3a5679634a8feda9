use kiln::prelude::*;

#[model]
struct Gpt {
    tok: Embedding<256, 16>,
    pos: Embedding<32, 16>,
    q: Linear<16, 16>,
    k: Linear<16, 16>,
    wide: Linear<16, 24>,
}

#[model]
impl Gpt {
    // A context longer than the position table.
    fn embed<const B: usize>(&self, ids: Tensor<B, 40, i32>) -> Tensor<B, 40, 16> {
        self.tok(ids) + self.pos.positions(ids)
    }

    // q·k without the transpose.
    fn scores<const B: usize>(&self, x: Tensor<B, 8, 16>) -> Tensor<B, 8, 8> {
        self.q(x).matmul(self.k(x))
    }

    // Three heads do not divide a width of 16.
    fn heads<const B: usize>(&self, x: Tensor<B, 8, 16>) -> Tensor<B, 8, 3, 5> {
        self.q(x).reshape::<B, 8, 3, 5>()
    }

    // A head tied to the token embedding, fed rows of the wrong width.
    fn tied<const B: usize>(&self, x: Tensor<B, 8, 16>) -> Tensor<B, 8, 256> {
        self.tok.attend(self.wide(x))
    }

    // A residual of the wrong width.
    fn residual<const B: usize>(&self, x: Tensor<B, 8, 16>) -> Tensor<B, 8, 16> {
        x + self.wide(x)
    }
}

fn main() {}
