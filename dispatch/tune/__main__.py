from dispatch.tune import main

if __name__ == "__main__":  # spawned compile workers re-import this module: they must not run main
    main()
