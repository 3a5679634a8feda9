// Outside #[model]: elementwise operands must have the same shape type.
use kiln::prelude::*;

fn main() -> Result<()> {
    let dev = CpuDevice;
    let a = Tensor::<Cpu, Rank2<2, 3>>::zeros(&dev)?;
    let b = Tensor::<Cpu, Rank2<2, 4>>::zeros(&dev)?;
    let _c = a.add(&b)?;
    Ok(())
}
