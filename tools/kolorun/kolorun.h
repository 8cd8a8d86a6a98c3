/*
 * kolorun — the launcher: starts N ranks of a command on this machine,
 * carries their output, and ends the job cleanly whatever happens.
 *
 *     kolorun -np 4 python3 train.py
 *
 * HOW IT WORKS
 *
 * Processes. kolorun makes a private rendezvous directory (mkdtemp, mode
 * 0700) and forks one child per rank. Each child sets the KOLO_* variables
 * of its rank, points stdin at /dev/null, its stdout and stderr at two pipes
 * that kolorun reads, and execs the command. Until the exec, a child can
 * tell kolorun what failed (open, dup2, exec: an errno) on a close-on-exec
 * pipe; kolorun waits for that pipe to close, which means the rank runs, or
 * to bring an errno, which it reports as "kolorun: cannot start rank 1:
 * open /dev/null: Too many open files", not as a rank that "exited with
 * status 127". All ranks join ONE new process group, separate from
 * kolorun's own group:
 *  - a terminal sends Ctrl-C (SIGINT) to its foreground group only, that is
 *    to kolorun and not to the ranks; kolorun forwards it once. Had the ranks
 *    stayed in kolorun's group they would get every Ctrl-C twice (from the
 *    terminal and from kolorun), and a Python rank would see its
 *    KeyboardInterrupt raised a second time in the middle of its cleanup;
 *  - one kill(-group) reaches what the ranks started themselves too (a shell
 *    wrapper's children, data-loader workers), which a kill per rank pid
 *    would miss;
 *  - kolorun can signal the group without signalling itself.
 * The group is led by a "holder", a child of kolorun that only waits (it
 * ignores every signal but SIGKILL) until kolorun kills it at the end. While
 * the holder is unreaped the group's id cannot be reused, so kill(-group)
 * can never hit a stranger, even after every rank has been reaped: when a
 * stopped job's ranks are gone but something they started ignores the
 * signal (a shell's `cmd &` ignores SIGINT), the final SIGKILL still reaches
 * it, and no orphan is left holding a GPU.
 * The price: ranks are not in the terminal's foreground group, so they must
 * not read the terminal (hence stdin = /dev/null), and Ctrl-Z would stop
 * kolorun alone, which is why kolorun forwards SIGTSTP and SIGCONT as well.
 * If kolorun dies without a chance to clean up (SIGKILL, a crash), the kernel
 * kills the ranks and the holder for it: each asks for
 * PR_SET_PDEATHSIG(SIGKILL) (the ranks before exec). Only the rendezvous
 * directory, and what ranks started themselves, may be left behind then.
 *
 * Pipes. kolorun is single-threaded; one poll() loop waits on every rank's
 * two pipes and on a self-pipe that signal handlers write to, and never
 * spins. Each pipe has a 64 KiB line buffer. Only whole lines leave it (a
 * line longer than the buffer leaves in 64 KiB pieces, and a last line
 * without a newline leaves at end of file), each batch in one write(), so
 * lines of different ranks never mix. Every line gets the prefix
 * "[rank]<stdout>:" or "[rank]<stderr>:", as horovodrun does by default
 * (and Open MPI's mpirun with --tag-output), so logs and the tools that
 * read them look the same; like horovodrun, a line ends at \n or at \r
 * (a progress bar redrawn with \r shows as it goes). --no-tag-output
 * passes the bytes unchanged. --prefix-output-with-timestamp puts the
 * local time before the prefix, as horovodrun does. --output-filename DIR
 * also writes what is shown of each rank's stream to DIR/rank.R/stdout or
 * stderr, horovodrun's layout, from the same loop. A rank's stdout and
 * stderr are two pipes, so their relative order is not kept, as under any
 * launcher.
 * If kolorun's own stdout is a closed pipe (kolorun ... | head), kolorun
 * closes the ranks' stdout pipes in turn: they get the EPIPE/SIGPIPE they
 * would have got writing to head themselves, instead of running on unseen.
 *
 * Signals. Handlers only set a flag and write one byte to the self-pipe
 * (both async-signal-safe); the loop does the work. SIGCHLD wakes the loop,
 * which reaps with waitpid(WNOHANG). SIGINT, SIGTERM, SIGHUP and SIGQUIT are
 * forwarded to the ranks; if a rank is still alive GRACE_MS (3 s) later, it
 * gets SIGKILL. A second Ctrl-C kills at once. A signal that was ignored when
 * kolorun started (nohup, `cmd &` in a script) stays ignored, for kolorun and
 * for the ranks, as the shell meant. Signals are blocked around fork() so
 * that a child never runs kolorun's handlers between fork and exec.
 *
 * The flight recorder (flight.c). Every rank gets KOLO_FLIGHT_DIR
 * (--flight-dir, the user's, else a directory of kolorun's own, removed
 * after a job that succeeded), where its runtime writes its dumps. kill
 * -USR1 of kolorun passes SIGUSR1 on to the ranks here whose runtime said
 * it takes it (DIR/rank<R>.ready, with the pid to signal: any other
 * program would die of SIGUSR1), and the job goes on. Before kolorun
 * stops a job (a rank failed and the failure grace is over, a stop signal
 * came), those ranks get SIGUSR1 first and kolorun waits, up to 2 s and
 * without blocking the loop, for their dumps, then goes on as below. At
 * the end it prints rank 0's DIR/stragglers.txt, and after a failure
 * names the directory if a rank wrote to it.
 *
 * Ending. (An elastic job ends otherwise: see "Elastic jobs" below.)
 * When a rank exits non-zero or is killed, and kolorun was not
 * already stopping the job, the job has failed: kolorun prints the rank's
 * remaining output, then one line naming the cause ("kolorun: rank 1
 * (pid 42) exited with status 3"), lets the others report the loss for the
 * failure grace (--failure-grace, 5 s), then sends them SIGTERM (SIGKILL
 * after the grace period) and drains their output. The first rank reaped is
 * not always the cause: when a rank is killed, its peers see their
 * connections close and exit with an error of their own, and on a busy
 * machine kolorun may find several ranks ended at once, where waitpid hands
 * over the oldest child first, whichever ended first. So the cause is
 * chosen among the ranks that failed within KOLORUN_BLAME_MS (a short
 * moment, for a killed process that is still being torn down) of the first
 * failure, or until every rank has ended: a rank killed by a signal (it did
 * not choose to end; the others end because of it), else a rank that a
 * survivor names in the runtime's words ("lost rank N (pid P)", "rank N
 * (pid P) left ...", "rank N has shut down, which stops the job", "rank N
 * had failed"; a stall shutdown's "rank N is missing 'x' (61 s)" and a
 * deadlock's "deadlock: rank N skipped 'x' ...", whose line says what it
 * did: "rank 2 stalled the job: it never enqueued 'x' (the others waited
 * 61 s); rank 2 (pid P) is still running"), else the first one reaped —
 * unless the ranks disagreed on a tensor ("ranks disagree on the shape:
 * ...") or, deadlocked, went different ways: no rank caused that alone,
 * and the line says so ("the ranks disagreed on tensor 'x' (the shape:
 * rank 0 has [2], rank 1 has [3])"; the status is the first failed
 * rank's). A rank killed by a signal is
 * the cause at once. When no failed rank was killed or named, but the
 * survivors name a rank that has not ended yet (a Python program printing
 * its traceback and tearing down, often slower than the survivors that
 * fail because of it), kolorun waits for it, up to the failure grace: it
 * is the cause once it fails, or, still running when the grace is over
 * (it caught the error and went on), is named as "stopped taking part in
 * the job ... and is still running" (status 1). Ranks
 * that die because kolorun stopped them are not causes; --verbose reports
 * them, and the failed ranks that were not chosen. When every rank is
 * gone and their pipes are at end of file (or, if something the ranks left
 * behind keeps a pipe open, after the grace period), kolorun removes the
 * rendezvous directory and exits:
 *   0        every rank exited with status 0;
 *   S        the rank named as the cause exited with status S — what
 *            mpirun does, so a script sees the rank's own status (on
 *            another host, 127: the command was not found there);
 *   128+N    the rank named as the cause was killed by signal N, the
 *            shell's way of writing "killed by N";
 *   127      kolorun could not start a rank: the command (or the launch
 *            command) was not found; 126: it could not be executed — the
 *            shell's numbers for the same;
 *   1        kolorun itself failed (rendezvous directory, fork, pipes, file
 *            descriptors), or could not start a rank for another reason;
 *   2        the command line was wrong.
 * When a signal stopped the job, kolorun ends by that same signal (default
 * action, raised on itself), so that a shell script running kolorun stops on
 * Ctrl-C as it would for any other command.
 *
 * Elastic jobs. --min-np or --host-discovery-script makes the job elastic
 * (horovodrun's rule; the contract between kolorun, the runtime and Python
 * is ELASTIC-CONTRACT.md of issue 21). A worker is one (host, slot); its id
 * is "host:slot", and "localhost" and "127.0.0.1" are two hosts, so one
 * machine can play two. Hosts come from the discovery script, which
 * kolorun runs with sh -c about once a second, one run at a time, each
 * killed after 10 s, its stdout read by the poll loop ("host:slots" lines,
 * or "host" with --slots-per-host); a run that fails or prints a line
 * kolorun does not understand changes nothing and is said once (a wrong
 * line spoils the whole list: half a list would read as hosts removed).
 * Without a script, -H/--hostfile are fixed hosts: fault tolerance
 * without scaling. Once -np slots are there (within --elastic-timeout),
 * kolorun publishes generation 1 with every slot up to --max-np and starts
 * its workers. A generation is written through the job's rendezvous, as
 * runtime/store.c reads it (a file per key, renamed into place, in the
 * rendezvous directory; SET in Redis): elastic/G/members (one "host:slot"
 * per line, in rank order), elastic/G/update (start, failure, added,
 * removed, mixed), then elastic/generation = G. Rank order: the hosts of
 * the last generation that remain, in their order, then new hosts in the
 * order listed; slots 0, 1, ... of each; the newest cut first at
 * --max-np. Each worker is started with KOLO_ELASTIC=1 (HOROVOD_ELASTIC=1),
 * KOLO_ELASTIC_ID, KOLO_HOSTNAME=host, KOLO_ELASTIC_TIMEOUT and its place
 * in the generation it starts for; the runtime reads the store at every
 * kolo_init and finds its rank there.
 * When a member exits non-zero or is killed, kolorun says so, blacklists
 * its whole host (for the --blacklist-cooldown-range cooldown, else for
 * good) and stops that host's other workers (SIGTERM, SIGKILL 3 s later;
 * their exits do not count). It waits 500 ms for the failures that come
 * with the first, so that one event makes one generation, then publishes
 * the survivors plus any new slots. Hosts that appear (or come back from
 * their cooldown) are added the same way; hosts that disappear are left
 * out of the next generation: their workers learn at kolo_init that they
 * were removed and exit, and kolorun ignores their exits; one still
 * running --elastic-timeout after its removal (or when the job ends) gets
 * SIGTERM. Every generation after the first is a reset; --reset-limit R
 * ends the job rather than publish reset R + 1. With fewer than --min-np
 * slots (or only new hosts, which hold no state) kolorun waits for
 * discovery up to --elastic-timeout. The job ends:
 *   0        once a member of the latest generation has exited 0 and the
 *            others have exited too (no generation is published then; a
 *            member failing at that point ends the job with its status);
 *   S, 128+N every rank failed ("kolorun: every rank failed: rank 0
 *            (localhost:0, pid 42) exited with status 3; ..."): the first
 *            failed member's status;
 *   1        the reset limit, too few ranks for --elastic-timeout, too
 *            few slots at the start: one line saying why.
 * Ending while workers may wait in kolo_init, kolorun first writes that
 * line to elastic/end, and gives them the failure grace to read it before
 * SIGTERM. kolorun stays single-threaded: the driver (elastic.c) runs at
 * every turn of the loop and names the next moment it must run again.
 *
 * LAYERS
 *
 * Each file calls only what lies below it; each layer has one header,
 * which says what its files hold:
 *   main.c        the top: the job from start to end, and the exit
 *                 status (kolorun.h, this header, includes every layer)
 *   elastic.h     the elastic driver: a policy on top of supervision,
 *                 told of the ranks' ends through kolorun_policy_t and
 *                 asking supervision to start and stop workers
 *   supervise.h   supervision: the poll loop, how ranks end and who is
 *                 blamed, stopping the job
 *   procs.h       the job's processes: the job's state (kolorun_t), the
 *                 rendezvous, spawning ranks with their environment,
 *                 their output, signalling them, mpirun
 *   cmdline.h     the command line: argv, horovodrun's flags, the config
 *                 file and host lists make the job description
 *                 (kolorun_opts_t)
 *   util.h        messages, the clock, strings, word lists, numbers
 */
#ifndef KOLORUN_H
#define KOLORUN_H

#include "elastic.h"

#endif /* KOLORUN_H */
