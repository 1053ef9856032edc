"""flatcheck against PyHessian, curvlinops and hessian-eigenthings, side by side, in one run.

Same model, data, batch size, probe count / Lanczos steps, dtype and device for every tool:

  trace     Hutchinson trace of the Hessian with the same number of Rademacher probes (HVPs)
  top-eig   top eigenvalue(s) to the same tolerance (flatcheck: Lanczos, true relative residual;
            PyHessian: power iteration, relative change of λ; hessian-eigenthings: power
            iteration, relative change and relative residual; curvlinops: scipy eigsh (ARPACK))
  slq       spectral density by stochastic Lanczos quadrature with the same steps and starts
  hvp/grad  flatcheck only: time of one HVP (in a block) ÷ time of one gradient, same data
  block     flatcheck only: 16 probes in one block against a loop of 16 single HVPs
  ggn       flatcheck only: exact GGN trace against Hutchinson (on G) at 1 % relative stderr

flatcheck runs once per backend in flatcheck.backends.list_backends() ("distributed" skipped).
Every row runs in its own process (forked from a server that has torch imported), so peak memory
is that row's own: the rise of the process's resident-set high-water mark over its resident set
just before the timed work (CPU), or torch.cuda.max_memory_allocated over the allocation before
it (CUDA). HVPs are products of the whole-sample-set Hessian with one vector (one product over
8 batches is one HVP): flatcheck counts them in its operator; for the peers they are counted by
wrapping the peer's own product function (PyHessian: hessian_vector_product and
dataloader_hv_product; curvlinops: columns passed to _matmat; hessian-eigenthings:
HessianOperator.matvec). A peer that fails is a row with its error, never dropped. With
--repeat N every row runs N times, the tools of a task taking turns, and each tool's row is its
run of median time (ratios are then of medians; HVP ÷ gradient, block and GGN rows: of median
ratio, speed-up, gradient-times) with the largest peak memory of its runs.

    python benchmarks/bench_peers.py [--models demo,resnet18,vit] [--device cpu|cuda|auto]
                                     [--full] [--save] [--backends autograd,func] [--peers ...]
                                     [--repeat N]

Layout: tasks.py (what runs at which size), problem.py (the model, batches and loss every tool
is given), measure.py (timing, peak memory, HVP counting), rows.py (a row, and repetitions folded
into one), one adapter per tool (tool_flatcheck.py, tool_pyhessian.py, tool_curvlinops.py,
tool_eigenthings.py), runner.py (the command line and the per-row processes) and report.py
(the tables, markdown and json).
"""
