from dispatch.tune import main

main()
