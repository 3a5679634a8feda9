// Outside #[model]: the typed API checks matching dims through the trait system.
use kiln::prelude::*;

fn main() -> Result<()> {
    let dev = CpuDevice;
    let a = Tensor::<Cpu, Rank2<2, 3>>::zeros(&dev)?;
    let b = Tensor::<Cpu, Rank2<4, 5>>::zeros(&dev)?;
    let _c = a.matmul(&b)?;
    Ok(())
}
