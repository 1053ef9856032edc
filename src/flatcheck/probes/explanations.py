"""What `flatcheck explain PROBE` says about each probe: the prose a person needs once.

The knobs are not written here: `flatcheck explain` reads them from the probe's Options
dataclass (flag, default, help), so that they cannot drift from the command's own flags.
tests/commands/test_explain.py checks that every registered probe has an entry and no entry is orphaned.
Papers are cited by author and year.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Explanation:
    measures: str    # one or two sentences a newcomer understands
    definition: str  # the formula flatcheck computes, over the sample set S of N samples
    units: str
    large: str       # what a large value means
    small: str       # what a small value means
    moves: str       # what moves it (and what does not)
    source: str      # papers, by author and year
    cost: str        # in curvature products (Hessian- or GGN-vector products) and passes


_CURVATURE_UNITS = ("loss per squared parameter unit (1/[θ]² times the loss's unit); a sum over the P probed "
                    "parameters, so it grows with P — Tr/P, the mean eigenvalue, compares models of different size")
_RESCALING = ("not invariant to reparametrisation: scaling one layer of a ReLU network by α and the next by 1/α "
              "leaves the predictions unchanged and moves it by orders of magnitude (Anonymous 2025, Fig. 1; "
              "try `flatcheck invariance`)")

EXPLANATIONS: dict[str, Explanation] = {
    "trace": Explanation(
        measures="How sharply the loss curves on average over all directions in parameter space: the trace of the "
                 "Hessian H (or of the Gauss-Newton matrix G), with a per-layer breakdown.",
        definition="Tr(H) = Σ_i λ_i(H), H = ∇²_θ L, L(θ) = (1/N) Σ_n ℓ(f(x_n; θ), y_n). Hutchinson: (1/m) Σ_k v_kᵀ H v_k "
                   "with Rademacher v_k, mean ± standard error: where the products H v_k are formed (the GGN, the func "
                   "backend) the larger of the values' spread and √(2(‖H‖_F² − Σ H_ii²)/m) estimated from the products "
                   "(a normal interval: the spread of few skewed values under-covers), else (vᵀHv alone: the autograd "
                   "backend's Hessian) the spread s with Student's t on m − 1 degrees of freedom, widened to "
                   "± s·(t + |G1|·(2z² + 1)/(6√m)) with G1 the values' sample skewness, the symmetric enclosure of "
                   "the skewness-corrected interval (details.interval names which; Johnson 1978, Hall 1992); "
                   "Hutch++ deflates a low-rank part first; exact (GGN, "
                   "cross entropy): Tr(G) = (1/N) Σ_n Σ_c p_nc ‖∇_θ(f_nc − p_n·f_n)‖².",
        units=_CURVATURE_UNITS,
        large="a sharp region: a random small step in the weights raises the loss quickly.",
        small="a flat region on average; a negative Hessian trace means negative curvature dominates (not a minimum).",
        moves="training (it typically rises early, then settles), the learning rate and batch size (larger steps "
              "end in flatter regions), weight decay, label smoothing, the BatchNorm mode (--bn-mode), which "
              "parameters are probed (--params); " + _RESCALING + ".",
        source="Hutchinson 1989 (estimator); Meyer et al. 2021 (Hutch++); Anonymous 2025, §3 and App. A.1 "
               "(the exact GGN trace as a centered decomposition).",
        cost="Hutchinson: one curvature product per probe, at least --min-probes (10) and at most --probes-max (100); "
             "by default it stops at a relative standard error of 5 %. Hutch++: 3·⌊--probes-max/3⌋ products (9 at "
             "--probes-max 10), a third each for its sketch, its basis and its residual probes, up to 3·P "
             "(P parameters): there its sketch spans every direction and the trace is exact, so it takes no more. "
             "Exact GGN: no products, C backward passes per batch (C classes; --class-samples K draws K instead). "
             "One product costs about two to four gradients over the N samples.",
    ),
    "lmax": Explanation(
        measures="The sharpest directions: the largest eigenvalues of the Hessian (or GGN) and how well each "
                 "converged.",
        definition="The k algebraically largest eigenvalues λ_1 ≥ … ≥ λ_k of H (or G; k = 1 by default, λ_max) "
                   "by block Lanczos from --starts random vectors (default 2) with full reorthogonalisation (or power "
                   "iteration), each with its residual r = ‖Hq − λq‖ and an error bound: r²/δ (Kato–Temple) "
                   "with δ the gap to the neighbouring Ritz values, or r where no gap is resolved; it stops when "
                   "every bound ≤ TOL·|λ|, or reports a stall at the dtype's noise floor. The second start is "
                   "what resolves two eigenvalues a fraction of a percent apart, which one start would report "
                   "as one with too small a bound.",
        units=_CURVATURE_UNITS.split(";")[0] + "; not a sum, so it does not grow with P as the trace does",
        large="the loss rises steeply along some direction; for gradient descent with step size η, training is "
              "unstable along directions with λ > 2/η, so λ_max tends to settle near 2/η.",
        small="no steep direction: flat along every direction at the scale of the weights.",
        moves="the learning rate (λ_max ≈ 2/η at the edge of stability), batch size, training time (progressive "
              "sharpening), the BatchNorm mode; " + _RESCALING + ".",
        source="Lanczos 1950; MacDonald et al. 2023 (progressive sharpening and λ_max); Anonymous 2025 "
               "(its manipulation by rescaling).",
        cost="--starts curvature products per block Lanczos step (default 2), as one block: typically one to a "
             "few dozen, at most --max-iter (default max(300, 20k)); power iteration: up to --max-iter per "
             "eigenvalue (default 1000).",
    ),
    "spectrum": Explanation(
        measures="The whole eigenvalue density of the Hessian (or GGN), and from it Tr(H), Tr(H²) and ‖H‖_F; the "
                 "headline value is ‖H‖_F = √Tr(H²), the others are in details.",
        definition="Stochastic Lanczos quadrature: from --starts Rademacher start vectors, --lanczos-steps Lanczos "
                   "steps each; nodes = Ritz values θ_j, weights w_j = squared first components of the tridiagonal's "
                   "eigenvectors, averaged over the starts; Tr(H) ≈ P·Σ w_j θ_j, Tr(H²) ≈ P·Σ w_j θ_j².",
        units="nodes in the units of the eigenvalues (" + _CURVATURE_UNITS.split(";")[0] + "); weights are "
              "fractions of the P eigenvalues and sum to 1",
        large="mass far from zero: many sharp directions; a few isolated outliers above a bulk is the usual shape "
              "of a trained classifier (about C of them).",
        small="mass near zero: most directions are flat (see `flatcheck explain rank`).",
        moves="the same as trace and lmax; the density's resolution depends on --lanczos-steps and --sigma.",
        source="Ghorbani et al. 2019 and Granziol 2020, App. B (stochastic Lanczos quadrature).",
        cost="--starts × --lanczos-steps curvature products (default 2 × 100 = 200). The ± of Tr, Tr² and "
             "‖H‖_F is the spread of the starts floored by one start's known variance (2·Tr f(H)², from the run's own "
             "moments and Ritz values), a normal interval: a matrix one eigenvalue dominates skews a few starts "
             "low, and the floor keeps their ± from shrinking with them; --starts 20 narrows it. Memory: the "
             "Lanczos basis, "
             "--lanczos-steps × P numbers, or two vectors with --reorth none (auto: when the basis does not fit "
             "--max-memory). Under --budget a start may stop short of its steps: the result is then unresolved, "
             "with its nodes and its unbiased Tr and Tr² but no smoothed density (too few nodes to place "
             "eigenvalues), and --plot draws the nodes alone.",
    ),
    "rank": Explanation(
        measures="How degenerate the curvature is: the fraction of directions with (near) zero curvature, beside "
                 "two bounds on the rank.",
        definition="From the SLQ nodes: the weight of the node nearest 0 (GGN), or of the two nodes nearest 0 "
                   "(Hessian); compared with the bound 1 − 4·C·(Σ_l N_l + d_x)/P and with rank(G) ≤ N·(C − 1).",
        units="a fraction of the P eigenvalues, between 0 and 1",
        large="most directions are flat: the model has far more parameters than the curvature can use.",
        small="curvature spreads over many directions.",
        moves="over-parametrisation (P against N and C), the number of samples N (the GGN's rank is at most "
              "N·(C − 1)), the Lanczos resolution (--lanczos-steps).",
        source="Granziol 2020, §3.2 and App. D.",
        cost="--starts × --lanczos-steps curvature products (default 2 × 100 = 200) and memory, as spectrum. "
             "Under --budget a start may stop short of its steps: the result is then unresolved (fewer nodes "
             "leave a wider window around 0, so D is another quantity than a full run's) and no gate decides "
             "on it.",
    ),
    "adaptive-sharpness": Explanation(
        measures="How much the loss rises, on average, when every weight is jiggled by noise proportional to its "
                 "own size.",
        definition="S_ρ = E_{δ ~ N(0, ρ² diag(|w|²))}[L(w + δ)] − L(w), by Monte Carlo over antithetic pairs ±δ, "
                   "and its second-order form (ρ²/2)·Tr(diag|w| H diag|w|) by Hutchinson with probes v⊙|w|.",
        units="the loss's own units (a difference of losses); it scales with ρ²",
        large="the loss is sensitive to relative perturbations of the weights: sharp in a way that elementwise "
              "rescaling cannot hide.",
        small="robust to relative noise; a value within its own error of zero is zero within noise (raise "
              "--noise-draws or ρ to resolve it).",
        moves="ρ (as ρ² for small ρ), the loss (--loss; Chen et al. 2023 use a sigmoid with MSE), training; it is "
              "invariant to elementwise rescalings that preserve the function, by construction.",
        source="Kwon et al. 2021; Andriushchenko et al. 2023; Chen et al. 2023, §E.2 and App. F.",
        cost="Monte Carlo: 2 × --noise-draws forward passes over the N samples (no products); second-order "
             "form: one curvature product per Hutchinson probe, at most --probes-max (100), and with both "
             "(the default) 8 more that decide which of the two is the headline.",
    ),
    "relative-flatness": Explanation(
        measures="Flatness of the final linear layer measured relative to its weights, so that rescaling the "
                 "layer does not change it.",
        definition="κ = Σ_{s,s'} ⟨w_s, w_s'⟩ Tr(H_{s,s'}) over the rows w_s of the head weight W; for cross entropy, "
                   "closed form: κ = (1/N) Σ_n ‖φ_n‖² (Σ_s p_ns ‖w_s‖² − ‖Σ_s p_ns w_s‖²), φ_n the head's input.",
        units="the loss's own units (weight² × curvature)",
        large="the head's loss is sensitive to relative changes of its weights: less flat, worse generalisation "
              "expected (Petzka et al. 2021).",
        small="flat relative to the weight scale.",
        moves="the features' norms ‖φ_n‖, the spread of the head's rows weighted by the predicted probabilities, "
              "the confidence of the predictions (confident predictions make it small).",
        source="Petzka et al. 2021; Taleghani et al. 2026, Definition 1.",
        cost="no curvature products: one forward pass per batch (closed form).",
    ),
    "head-trace": Explanation(
        measures="The exact Hessian trace of the loss with respect to the final linear layer alone.",
        definition="Tr ∇²_{W,b} L = (1/N) Σ_n (Σ_j p_nj (1 − p_nj)) ‖φ̄_n‖² (+ (1/N) Σ_n Σ_j p_nj (1 − p_nj) for the "
                   "bias), φ̄_n the pooled features entering the head; exact for any linear head on a fixed backbone.",
        units=_CURVATURE_UNITS.split(";")[0] + "; a sum over the head's parameters",
        large="uncertain predictions on large features: the head sits in a sharp region.",
        small="confident predictions (p_nj near 0 or 1) or small features.",
        moves="the confidence of the predictions, the feature norms, temperature or label smoothing; "
              "with --verify it is checked against autograd on a subset of coordinates.",
        source="Taleghani et al. 2026, Theorem 1 and Corollary 3.",
        cost="no curvature products: one forward pass per batch; --verify adds Hessian-vector products "
             "(--verify-max coordinates, --verify-block per pass).",
    ),
    "gini": Explanation(
        measures="How uncertain the model's predictions are on average, with the entropy, accuracy and mean loss.",
        definition="mean over S of 1 − ‖p_n‖², p_n = softmax(f(x_n)); also −Σ p log p (nats), top-1 accuracy and the "
                   "mean loss of the spec.",
        units="none: between 0 and 1 − 1/C",
        large="spread-out, uncertain predictions; the GGN's curvature weights each sample by such terms, so it "
              "bounds how much curvature the outputs can carry.",
        small="confident predictions (one class near probability 1).",
        moves="training time, temperature and label smoothing, the data split.",
        source="Anonymous 2025, App. A.2.",
        cost="no curvature products: one forward pass per batch.",
    ),
    "gap": Explanation(
        measures="The generalisation gap: test loss minus train loss, with both accuracies.",
        definition="value = L_test − L_train, each the exact mean over the first N samples of its split.",
        units="the loss's own units",
        large="the model fits the training samples much better than unseen ones (over-fitting).",
        small="train and test behave alike; negative when the test samples are easier.",
        moves="training time, regularisation, data augmentation, the number of samples N (its noise shrinks "
              "as 1/√N).",
        source="the quantity every paper reports beside its flatness measure (e.g. Anonymous 2025; Chen et al. 2023).",
        cost="no curvature products: one forward pass per batch of each split.",
    ),
    "jacobian": Explanation(
        measures="How strongly the outputs react to small changes of the input: norms of the input-output "
                 "Jacobian, mean and max over the samples.",
        definition="J_n = ∂f(x_n)/∂x_n (C × D, f = logits or softmax); per sample ‖J_n‖_F and ‖J_n‖_2; value = mean of "
                   "‖J_n‖_F; exact (C backward passes) or estimated (random projections for ‖J_n‖_F, Lanczos on J_nJ_nᵀ "
                   "for ‖J_n‖_2, with its residual bound).",
        units="output units per input unit (per pixel value after normalisation)",
        large="inputs near a decision boundary or an input-sensitive function: small input changes move the "
              "predictions.",
        small="a locally smooth function of its input.",
        moves="training (MacDonald et al. 2023 relate the max spectral norm of the softmaxed model to "
              "generalisation), input normalisation (--mean/--std), --output logits vs softmax.",
        source="MacDonald et al. 2023, Theorem 4.5; Anonymous 2025, Table 3 (--exclude-region).",
        cost="no curvature products: exact takes C backward passes per batch; estimate takes --projections "
             "backward passes plus up to --lanczos-iters VJP/JVP pairs per sample (to --lanczos-tol).",
    ),
    "mls": Explanation(
        measures="Maximum local sensitivity: the mean spectral norm of the input-output Jacobian, normalised "
                 "variants, and the bounds that tie it to the weights' gradients.",
        definition="MLS = (1/N) Σ_n ‖J(x_n)‖_2; normalized MLS = (1/N) Σ_n ‖x_n‖·‖J(x_n)‖_2 (key normalized_mls); "
                   "NMLS = Σ_l (1/N) Σ_n ‖∂f/∂h_l(x_n)‖_2 over the inputs h_l of every Linear/Conv layer; log local "
                   "volume = Σ_i log σ_i(J); local dimensionality = (Σλ)²/Σλ² of the eigenvalues of J Jᵀ.",
        units="MLS: output units per input unit; normalized MLS: output units (invariant to input scaling)",
        large="sensitive outputs; the bound ties a large MLS to large weight gradients (sharpness).",
        small="locally flat in input space.",
        moves="the same as jacobian. The MLS bound is given when the first layer is a Linear that takes x itself, "
              "NMLS's when every layer is dense (a Linear on one vector per sample); otherwise it is n/a, and the "
              "table note and details.mls_bound_reason / nmls_bound_reason say which layer is not.",
        source="Chen et al. 2023, §3.",
        cost="no curvature products: exact takes C backward passes per batch; estimate takes --projections draws "
             "and up to --lanczos-iters Lanczos steps per sample.",
    ),
    "activations": Explanation(
        measures="How often each ReLU-like unit fires, and how many never fire on any sample (dead units).",
        definition="per layer: death frequency ξ = (#positions zero for every sample)/(#positions); activation "
                   "frequency η = mean over samples of the fraction of non-zero outputs among positions not dead; "
                   "value = mean ξ over layers.",
        units="fractions between 0 and 1",
        large="(ξ) many dead units: capacity the network does not use; the weights into a dead unit get no "
              "gradient and add no curvature.",
        small="(ξ) every unit fires for some sample.",
        moves="the learning rate, weight decay, initialisation, training time.",
        source="Anonymous 2025, §2.",
        cost="no curvature products: one forward pass per batch.",
    ),
    "decomposition": Explanation(
        measures="The GGN trace of the layers' weights split per layer into a scale term and a centered term, with "
                 "a scale-aware upper bound, beside the GGN trace of those weights (details.ggn_trace_weights) and "
                 "Tr(G) over every probed parameter, biases and norm parameters included (details.ggn_trace).",
        definition="per Linear/Conv layer l: s_{l−1} = ‖a^{(l−1)}‖², λmax(M^{(l)}) = σ_max(∂f/∂z^{(l)})², the centered "
                   "term Σ_i p_i (v_i − v̄)ᵀ M^{(l)} (v_i − v̄); value Σ_l s_{l−1}·centered, plus, for a dense weight "
                   "used by several calls i, j, the cross terms 2 (a_i·a_j) Tr(A D_i D_jᵀ) (D = ∂f/∂z of a call, "
                   "A the loss's output Hessian) that make it the weights' GGN trace exactly; "
                   "bound 2 Σ_l s_{l−1} λmax(M^{(l)}) Σ_i p_i ‖v_i‖².",
        units=_CURVATURE_UNITS.split(";")[0],
        large="curvature driven by large activations (scale) or by spread-out predictions (centered term): the "
              "decomposition says which.",
        small="small activations or confident predictions.",
        moves="layer rescaling moves s and λmax in opposite directions — the reason the trace alone can be "
              "manipulated (Anonymous 2025).",
        source="Anonymous 2025, §3 and App. A.1.",
        cost="no curvature products: C backward passes per batch (as the exact GGN trace), beside that trace.",
    ),
}
