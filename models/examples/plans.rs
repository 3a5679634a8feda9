//! Prints what the models in `kiln_models` are: with no argument their build-time
//! fusion plans as reports; `--dot` the Graphviz graph, `--text` the plan text,
//! `--summary` each model's layers with their output shapes and parameter counts.

use kiln::cpu::Cpu;
#[path = "../src/gpt_instances.rs"]
mod gpt_instances;
use gpt_instances::SmallGpt;
use kiln_models::lenet::LeNet;
use kiln_models::mlp::Mlp;

fn main() -> kiln::Result<()> {
    let arg = std::env::args().nth(1).unwrap_or_default();
    if arg == "--summary" {
        for summary in [
            Mlp::<Cpu>::summary(),
            LeNet::<Cpu>::summary(),
            SmallGpt::<Cpu>::summary(),
        ] {
            println!("{summary}");
        }
        return Ok(());
    }
    for plans in [
        Mlp::<Cpu>::fusion_plans(),
        LeNet::<Cpu>::fusion_plans(),
        SmallGpt::<Cpu>::fusion_plans(),
    ] {
        match arg.as_str() {
            "--dot" => print!("{}", kiln::fusion::report::dot_all(plans)?),
            "--text" => plans.iter().for_each(|(t, p)| println!("# {t}\n{p}")),
            "" => print!("{}", kiln::fusion::report::report_all(plans)?),
            other => {
                return Err(kiln::tensor::Error::invalid(
                    "plans",
                    format!("unknown flag `{other}`: use --dot, --text or --summary"),
                ))
            }
        }
    }
    Ok(())
}
