// Outside #[model]: a reshape's element count is a post-monomorphization check, so
// it fires under `cargo build` (trybuild builds), not under `cargo check`.
use kiln::prelude::*;

fn main() -> Result<()> {
    let dev = CpuDevice;
    let a = Tensor::<Cpu, Rank2<2, 3>>::zeros(&dev)?;
    let _b = a.reshape::<Rank2<4, 2>>()?;
    Ok(())
}
