"""A catalogue of user mistakes: what happens when I get X wrong, for every entry point of torchnlq.

Read it as a table, one file per entry point (``test_run_train.py``, ``test_prepare_data.py``, ...,
``test_benchmark_train_step.py`` for ``python -m benchmarks.train_step``): its ``IN_PROCESS`` and
``SUBPROCESS`` rows. Each row is one mistake a user can make: the command, its arguments (and the bad
files lying around, written by the row's ``setup``), and a fragment the error line must contain, so that
a row cannot pass with some other error. Its test id reads ``entry:mistake``. Every mistake must end the
same way, the project's rule:

* exit code 2;
* exactly one line on stderr, starting with ``error:``, that says what is wrong and how to fix it;
* no Python traceback, on stdout or stderr;
* nothing written or deleted: a snapshot of every path under the row's folder (the parent of its
  working directory, so ``..`` is watched too) and under the shared inputs (each file's sha256 and
  mtime) is the same before and after.

Most rows run in this process: the entry point's ``main(argv)`` through :func:`torchnlq.cli.run_cli`,
as its ``__main__`` block calls it (a Python process with torch for each row would take minutes). An
exception escaping ``main`` is what a user would see as a traceback: the row fails with it. Python
warnings are counted as stderr lines, as a terminal shows them. What only a real process shows (log
handlers bound to the real stderr, messages of torch's C++ side, the shell script itself) is covered
by a few rows run as processes: one per Python entry point, and run_train.sh's own checks
(``test_mistake_in_a_subprocess``, marked ``integration``; they all start together, see conftest.py).

Caches are outside the snapshots by design: this test's HF_HOME, TIKTOKEN_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR (tests/conftest.py, and the subprocesses' own) and the TORCHNLQ_CACHE folder it
gives run_train.sh. Everything else counts, including the cache folder run_train.sh creates by default.

A row marked ``xfail`` (strict) is a known violation, not fixed yet; its reason names the cause and the
file where the fix belongs. When the fix lands the row passes, strict xfail fails, and the mark comes off.

The files: ``rows.py`` (a row, the placeholders of its command line, the set-ups of its bad files),
``runner.py`` (the entry points, how a row runs and is checked), ``conftest.py`` (the shared inputs and
the subprocess rows in flight), ``test_the_catalogue.py`` (all rows together: every one distinct).

To add a mistake: add a ``row(entry, name, argv, fragment, setup=...)`` to its entry point's file;
``argv`` and file contents may use the placeholders of :meth:`rows.Inputs.places` ({tmp}, {data}, {ckpt} ...).
A new entry point: a name in ``runner.ENTRIES`` and a file of its rows (at least one a real process).
"""
