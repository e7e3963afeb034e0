//! `gpuplace simulate --dra`: the same workload with its GPUs claimed through DRA.

use crate::simulate::{gpuplace, json_of, refusal_of};

/// Runs `simulate` with `args` on the built-in workload (1/16 of its size); stdout's JSON.
fn simulated(args: &[&str]) -> serde_json::Value {
    json_of(
        gpuplace()
            .args(["simulate", "--scale", "16", "--seeds", "2", "--json"])
            .args(args),
    )
}

/// Runs `simulate` with `args`, which must be refused; what it said.
fn refused(args: &[&str]) -> String {
    refusal_of(
        gpuplace()
            .args(["simulate", "--scale", "16", "--seeds", "1"])
            .args(args),
    )
}

/// The report without its times.
fn decisions(mut v: serde_json::Value) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.retain(|k, _| {
                    !["wall_s", "elapsed_s", "cpu_s", "claims"].contains(&k.as_str())
                });
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(list) => list.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}

/// `--dra` reads the claims and changes no decision of gpuplace's policies, only adds the
/// report's claims line (that the scheduler places claim pods as device-plugin pods is
/// shown through the scheduler by the testkit's `claims_twin`).
#[test]
fn dra_changes_no_decision_of_gpuplaces_policies_and_says_what_it_claimed() {
    // Half the multi-GPU pods ask NVLink (a matchAttribute constraint with claims).
    let linked = ["--require-topology", "0.5"];
    for mode in [
        &["--timeline", "--arrivals", "2000"][..],
        &[][..],
        &linked[..],
    ] {
        let policies = ["--policies", "gpuplace,fgd,best-fit"];
        let plain = simulated(&[mode, &policies[..]].concat());
        let claimed = simulated(&[mode, &policies[..], &["--dra"]].concat());
        assert!(plain.get("claims").is_none());
        let said = claimed["claims"]
            .as_str()
            .expect("the report says what was claimed");
        assert!(
            said.starts_with("DRA: the GPUs of the list's ")
                && said.contains("ResourceClaimTemplates"),
            "{said}"
        );
        assert_eq!(decisions(plain), decisions(claimed), "{mode:?}");
    }
}

#[test]
fn kube_dra_runs_only_with_claims_and_kube_default_only_without() {
    let v = simulated(&[
        "--timeline",
        "--arrivals",
        "2000",
        "--dra",
        "--policies",
        "kube-dra",
    ]);
    assert_eq!(v["policies"][0]["policy"], "kube-dra");
    let said = refused(&["--policies", "kube-dra"]);
    assert!(
        said.contains("kube-dra is kube-scheduler allocating DRA claims: add --dra"),
        "{said}"
    );
    let said = refused(&["--timeline", "--dra", "--policies", "gpuplace,kube-default"]);
    assert!(
        said.contains("with --dra kube-scheduler allocates the claims itself: ask kube-dra"),
        "{said}"
    );
}

#[test]
fn a_shape_a_claim_cannot_carry_is_refused_by_name() {
    let said = refused(&["--dra", "--prefer-topology", "1", "--policies", "gpuplace"]);
    assert!(
        said.contains("--dra: cannot claim this workload's GPUs: the claim of shape gpus-"),
        "{said}"
    );
    assert!(said.contains("no preferred topology"), "{said}");
}
