# This machine's speed now (instances of one kind differ ~3x and drift): the CPU-s of a fixed 20M-step pure-Python
# loop, to read run-to-run figures against. Sourced by suite_fresh_clone.sh and suite_pairs.sh.
calibrate() { python3 -c "import time; t = time.process_time(); s = 0
for i in range(20_000_000): s += i * i
print(f'{time.process_time() - t:.2f}')"; }
