use kiln::prelude::*;

#[model]
struct Net {
    fc: Linear<4, 10>,
}

#[model]
impl Net {
    // Rows of 10 into rows of 4: every row of the result after the second would take
    // the end of one row and the start of the next.
    fn rows(&self, x: Tensor<Dyn, 4>) -> Tensor<Dyn, 4> {
        self.fc(x).reshape::<Dyn, 4>()
    }

    // Each of the B rows holds 10 elements, which no count of rows of 4 makes.
    fn split<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, Dyn, 4> {
        self.fc(x).reshape::<B, Dyn, 4>()
    }

    // Regrouping written out, rows split whole, and a kept leading size: accepted.
    fn regrouped(&self, x: Tensor<Dyn, 4>) -> Tensor<Dyn, 4> {
        self.fc(x).regroup::<Dyn, 4>()
    }
    fn halves(&self, x: Tensor<Dyn, 4>) -> Tensor<Dyn, 5> {
        self.fc(x).reshape::<Dyn, 5>()
    }
    fn pairs<const B: usize>(&self, x: Tensor<B, 4>) -> Tensor<B, Dyn, 2> {
        self.fc(x).reshape::<B, Dyn, 2>()
    }
}

fn main() {}
