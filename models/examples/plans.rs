//! Prints the build-time fusion plans of the models in `kiln_models`: the report, or
//! with `--dot` the Graphviz graph, or with `--text` the plan text.

use kiln::cpu::Cpu;
use kiln_models::lenet::LeNet;
use kiln_models::mlp::Mlp;

fn main() -> kiln::Result<()> {
    let arg = std::env::args().nth(1).unwrap_or_default();
    for plans in [Mlp::<Cpu>::fusion_plans(), LeNet::<Cpu>::fusion_plans()] {
        match arg.as_str() {
            "--dot" => print!("{}", kiln::fusion::report::dot_all(plans)?),
            "--text" => plans.iter().for_each(|(t, p)| println!("# {t}\n{p}")),
            _ => print!("{}", kiln::fusion::report::report_all(plans)?),
        }
    }
    Ok(())
}
