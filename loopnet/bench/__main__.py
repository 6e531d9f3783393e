from loopnet.bench.run import main

main()
