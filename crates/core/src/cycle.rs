//! One scheduling cycle for a unit (a pod, or a gang whole): [`schedule`] runs Filter,
//! Score and Reserve for its members ([`place::trial`]), Permit ([`place::permit`]), and for
//! a unit whose members are there but do not fit, PostFilter: the chain of steps tried, in
//! this one order: priority preemption, then reclaim for a queue below its guarantee, then
//! make-room (moving pods that opted in). The scheduler's loop and its gang stage and the
//! simulator's timeline run every unit through [`schedule`]; `gpuplace defrag --plan` runs
//! pending pods through [`post_filter`]; what a step plans is the driver's
//! [`Planner`]'s (victims and places found by [`crate::preempt`], reclaim's
//! [`reclaim::plan_within_guarantees`], make-room by [`crate::defrag`]), and the plan that
//! comes back is carried out by the driver with its own clock: through the API server, or
//! on simulated time.
//!
//! Pure: planning reads the driver's snapshot; nothing here evicts, waits or reads a clock.

pub mod place;
pub mod reclaim;

use place::{Permit, Quorum, Trial};

/// A PostFilter step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Evict pods of lower priority (within the unit's queue when queues are in use).
    Preempt,
    /// Evict pods of queues above their guarantee for a queue below its own.
    Reclaim,
    /// Move pods that opted in out of the unit's way.
    MakeRoom,
}

/// The steps in the order every driver tries them.
pub const CHAIN: [Step; 3] = [Step::Preempt, Step::Reclaim, Step::MakeRoom];

/// What one step found for the unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found<P, W> {
    /// A plan: the chain ends here and the driver carries it out.
    Plan(P),
    /// Nothing this step can do; a later step may help. `W` says why.
    Nothing(W),
    /// The unit may not go further now (it never preempts, its earlier victims are still
    /// leaving, its requests are wrong): no later step runs. `W` says why.
    Stop(W),
}

impl<P, W> Found<P, W> {
    /// The same finding with the plan told by `plan` and the reason by `why`.
    pub fn map<Q, V>(self, plan: impl FnOnce(P) -> Q, why: impl FnOnce(W) -> V) -> Found<Q, V> {
        match self {
            Found::Plan(p) => Found::Plan(plan(p)),
            Found::Nothing(w) => Found::Nothing(why(w)),
            Found::Stop(w) => Found::Stop(why(w)),
        }
    }
}

/// A driver's planning for one unit: which steps apply to it, and each step's plan on the
/// driver's snapshot.
pub trait Planner {
    /// What the driver carries out.
    type Plan;
    /// Why a step planned nothing (the driver's words for the unit's message).
    type Why;
    /// Whether `step` applies to this unit at all (switched on, queues in use, ...); a step
    /// that does not apply is skipped without a word.
    fn applies(&self, step: Step) -> bool;
    /// Plans `step` for the unit.
    fn plan(&mut self, step: Step) -> Found<Self::Plan, Self::Why>;
}

/// What the chain came to: the plan of the step that found one, if any, and why each step
/// tried before it planned nothing, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chained<P, W> {
    pub plan: Option<(Step, P)>,
    pub why: Vec<(Step, W)>,
}

/// Runs the PostFilter chain for one unit: each step that applies, in [`CHAIN`]'s order,
/// until one plans or stops the chain.
pub fn post_filter<T: Planner>(planner: &mut T) -> Chained<T::Plan, T::Why> {
    let mut why = Vec::new();
    for step in CHAIN {
        if !planner.applies(step) {
            continue;
        }
        match planner.plan(step) {
            Found::Plan(plan) => {
                return Chained {
                    plan: Some((step, plan)),
                    why,
                };
            }
            Found::Nothing(w) => why.push((step, w)),
            Found::Stop(w) => {
                why.push((step, w));
                break;
            }
        }
    }
    Chained { plan: None, why }
}

/// A driver's unit in one cycle: its members' Filter, Score and Reserve, how many count
/// toward its minimum, and its PostFilter planning.
pub trait Unit: Planner {
    /// What the driver keeps for a member placed.
    type Placed;
    /// Why a member was not placed.
    type Unfit;
    /// Filter, Score and Reserve for the members (through [`place::trial`], once per domain
    /// where the unit has several, the best kept by [`place::keep_best`]).
    fn place(&mut self) -> Trial<Self::Placed, Self::Unfit>;
    /// The unit's members bound, waiting and its minimum.
    fn quorum(&self) -> Quorum;
    /// Reserve undone: what a trial that Permit did not allow took is given back before
    /// PostFilter plans.
    fn unreserve(&mut self, trial: &Trial<Self::Placed, Self::Unfit>);
}

/// What one cycle came to for a unit.
#[derive(Debug)]
pub enum Cycled<P, U, Plan, W> {
    /// Permit allowed the trial: its members bind (a gang's at once).
    Allowed(Trial<P, U>),
    /// Too few members exist: nothing binds, nothing was planned; the unit waits for them.
    MembersMissing(Trial<P, U>),
    /// Too few fit: PostFilter's chain ran; the trial (given back) says how many fit.
    PostFiltered {
        trial: Trial<P, U>,
        chained: Chained<Plan, W>,
    },
}

/// One cycle for `unit`: Filter, Score, Reserve, Permit, then PostFilter when the members
/// are there but do not fit. The driver carries out what comes back with its own clock.
pub fn schedule<T: Unit>(unit: &mut T) -> Cycled<T::Placed, T::Unfit, T::Plan, T::Why> {
    let trial = unit.place();
    match place::permit(unit.quorum(), trial.placed.len()) {
        Permit::Allow => Cycled::Allowed(trial),
        Permit::MembersMissing => {
            unit.unreserve(&trial);
            Cycled::MembersMissing(trial)
        }
        Permit::Unfit => {
            unit.unreserve(&trial);
            let chained = post_filter(unit);
            Cycled::PostFiltered { trial, chained }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plans `plans_at`, stops at `stops_at`, records what was asked.
    struct Script {
        on: Vec<Step>,
        plans_at: Option<Step>,
        stops_at: Option<Step>,
        asked: Vec<Step>,
    }

    impl Planner for Script {
        type Plan = Step;
        type Why = &'static str;
        fn applies(&self, step: Step) -> bool {
            self.on.contains(&step)
        }
        fn plan(&mut self, step: Step) -> Found<Step, &'static str> {
            self.asked.push(step);
            if self.stops_at == Some(step) {
                Found::Stop("waiting")
            } else if self.plans_at == Some(step) {
                Found::Plan(step)
            } else {
                Found::Nothing("no victims")
            }
        }
    }

    fn script(on: &[Step], plans_at: Option<Step>, stops_at: Option<Step>) -> Script {
        Script {
            on: on.to_vec(),
            plans_at,
            stops_at,
            asked: Vec::new(),
        }
    }

    #[test]
    fn the_steps_run_in_one_order_until_one_plans() {
        let mut s = script(&CHAIN, Some(Step::MakeRoom), None);
        let c = post_filter(&mut s);
        assert_eq!(s.asked, CHAIN.to_vec());
        assert_eq!(c.plan, Some((Step::MakeRoom, Step::MakeRoom)));
        assert_eq!(c.why[0], (Step::Preempt, "no victims"));
        let mut s = script(&CHAIN, Some(Step::Preempt), None);
        let c = post_filter(&mut s);
        assert_eq!(s.asked, vec![Step::Preempt]);
        assert!(c.why.is_empty());
    }

    #[test]
    fn steps_that_do_not_apply_are_skipped_and_a_stop_ends_the_chain() {
        let mut s = script(&[Step::Preempt, Step::MakeRoom], Some(Step::Reclaim), None);
        let c = post_filter(&mut s);
        assert_eq!(s.asked, vec![Step::Preempt, Step::MakeRoom]);
        assert!(c.plan.is_none());
        let mut s = script(&CHAIN, Some(Step::MakeRoom), Some(Step::Preempt));
        let c = post_filter(&mut s);
        assert_eq!(s.asked, vec![Step::Preempt]);
        assert_eq!(c.why, vec![(Step::Preempt, "waiting")]);
        assert!(c.plan.is_none());
    }
}
