"""How a process starts or joins Ray: the one runtime helper that jobs, benchmarks and infra/ share."""
