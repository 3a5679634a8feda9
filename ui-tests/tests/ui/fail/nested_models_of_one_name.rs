use kiln::prelude::*;

mod encoder {
    use kiln::prelude::*;

    #[model]
    pub struct Block {
        fc: Linear<16, 16>,
    }

    #[model]
    impl Block {
        pub fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 16> {
            self.fc(x).relu()
        }
    }
}

mod decoder {
    use kiln::prelude::*;

    #[model]
    pub struct Block {
        fc: Linear<16, 8>,
    }

    #[model]
    impl Block {
        pub fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 8> {
            self.fc(x)
        }
    }
}

#[model]
struct Net {
    enc: encoder::Block,
    dec: decoder::Block,
}

#[model]
impl Net {
    fn forward<const B: usize>(&self, x: Tensor<B, 16>) -> Tensor<B, 8> {
        self.dec(self.enc(x))
    }
}

fn main() {}
